// austen_extract: writes the Jane Austen corpus (data/austen.txt) from r-cran-janeaustenr's
// data/Rdata.rdb, verifying its SHA-256. Used by scripts/fetch_corpus.sh; the parsing is in
// rdata_reader.cpp.
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "file_util.h"
#include "rdata_reader.h"
#include "sha256.h"

namespace ex = deepspeed::examples;

int main(int argc, char** argv) {
  bool verify = true;
  std::string paths[2];
  int n_paths = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-verify") == 0) {
      verify = false;
    } else if (n_paths < 2 && argv[i][0] != '-') {
      paths[n_paths++] = argv[i];
    } else {
      n_paths = -1;
      break;
    }
  }
  if (n_paths != 2) {
    std::cerr << "usage: austen_extract [--no-verify] RDATA.rdb OUT.txt\n"
                 "  RDATA.rdb: usr/lib/R/site-library/janeaustenr/data/Rdata.rdb from the Debian\n"
                 "  package r-cran-janeaustenr (see scripts/fetch_corpus.sh). OUT.txt is written\n"
                 "  atomically, and only if its SHA-256 is "
              << ex::kAustenCorpusSha256 << " (unless --no-verify).\n";
    return 2;
  }
  try {
    const std::string text = ex::austen_corpus_text(paths[0]);
    const std::string digest = ex::sha256_hex(text);
    if (verify && digest != ex::kAustenCorpusSha256) {
      std::cerr << "austen_extract: " << paths[0] << " gives " << text.size()
                << " bytes with sha256 " << digest << ", expected " << ex::kAustenCorpusBytes
                << " bytes with sha256 " << ex::kAustenCorpusSha256
                << "; is this r-cran-janeaustenr 1.0.0? Nothing was written (--no-verify writes "
                   "it anyway).\n";
      return 1;
    }
    ex::write_file_atomically(paths[1], text);
    std::cout << "wrote " << paths[1] << ": " << text.size() << " bytes, sha256 " << digest << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "austen_extract: " << e.what() << "\n";
    return 1;
  } catch (...) {
    std::cerr << "austen_extract: unknown exception (a bug in deepspeed-cpp)\n";
    return 1;
  }
}
