// Reads character vectors out of an R lazy-load database (*.rdb, with its *.rdx index), the
// format of Debian r-cran-janeaustenr's data/Rdata.rdb, and assembles the Jane Austen corpus.
// Owns the container and R's XDR serialization as far as character vectors need; no R needed.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace deepspeed::examples {

struct RdbCharacterVector {
  std::string name;                // variable name from the .rdx index; "" when read without one
  std::vector<std::string> lines;  // UTF-8; an NA element becomes ""
};

// All objects of `rdb_path`, each a character vector, in the index's order.
// Layout (see docs/data.md): the .rdb holds records back to back; a record is a 4-byte
// big-endian *uncompressed* length followed by a zlib stream of one R serialization (XDR,
// version 2 or 3). The sibling .rdx (same stem; gzip or zlib of an R list "variables" ->
// name -> (offset, length), "references", "compressed") gives names and record positions; it is
// used when present, otherwise the records are read back to back from offset 0.
// Latin-1 strings are converted to UTF-8. Throws std::runtime_error naming the file, the
// record's byte offset and what was found, e.g. for a truncated record, a bad zlib stream, a
// record of another R type, or bzip2/xz compression (not supported).
std::vector<RdbCharacterVector> read_rdb_named_character_vectors(const std::string& rdb_path);

// The lines of each object of `rdb_path` (read_rdb_named_character_vectors without names).
std::vector<std::vector<std::string>> read_rdb_character_vectors(const std::string& path);

// The six Austen novels of r-cran-janeaustenr 1.0.0 as one text: each book's lines joined with
// '\n', books joined with one blank line ("\n\n"), no trailing newline, in the database's
// (alphabetical) order: emma, mansfieldpark, northangerabbey, persuasion, prideprejudice,
// sensesensibility. For that package the result is kAustenCorpusBytes long with SHA-256
// kAustenCorpusSha256. Throws std::runtime_error if the database does not hold those six books.
std::string austen_corpus_text(const std::string& rdb_path);

constexpr size_t kAustenCorpusBytes = 4025033;
constexpr char kAustenCorpusSha256[] =
    "ae4140c6e5ab543cc81f68358120258f0935ac9e27a30f44a7a564b349307867";

}  // namespace deepspeed::examples
