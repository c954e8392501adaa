// Unicode Normalization Form C, the `NFC` normalizer of tokenizer.json (Qwen2's): canonical
// decomposition then composition, so that "e" + U+0301 and U+00E9 tokenize alike. ICU does the
// work: its tables follow the Unicode version of the library, as tokenizers' follow its crate.
#pragma once

#include <string>
#include <string_view>

namespace deepspeed::examples {

/// Whether this build can normalize (it links ICU; CMake finds it when libicu-dev is installed).
bool nfc_available();

/// `utf8` in NFC. Text that is already NFC (all ASCII, most text) comes back unchanged. Bytes
/// that are not UTF-8 stay as they are and the text between them is normalized (tokenizers only
/// ever sees valid text; a corpus may not be). Throws NotSupportedError naming `source` when the
/// build has no ICU.
std::string to_nfc(std::string_view utf8, const std::string& source);

}  // namespace deepspeed::examples
