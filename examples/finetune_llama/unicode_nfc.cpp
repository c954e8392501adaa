// NFC through ICU's Normalizer2 (see unicode_nfc.h).
#include "unicode_nfc.h"

#ifdef DS_WITH_ICU
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>
#endif

#include "deepspeed/errors.h"
#include "util/check.h"

namespace deepspeed::examples {

bool nfc_available() {
#ifdef DS_WITH_ICU
  return true;
#else
  return false;
#endif
}

#ifdef DS_WITH_ICU
namespace {

// One run of valid UTF-8 in NFC.
void append_nfc(const icu::Normalizer2& nfc, std::string_view run, std::string* out) {
  const auto text =
      icu::UnicodeString::fromUTF8(icu::StringPiece(run.data(), static_cast<int32_t>(run.size())));
  UErrorCode status = U_ZERO_ERROR;
  if (nfc.isNormalized(text, status) && U_SUCCESS(status)) {
    out->append(run);
    return;
  }
  status = U_ZERO_ERROR;
  const icu::UnicodeString normalized = nfc.normalize(text, status);
  DS_CHECK(U_SUCCESS(status), Error, "NFC normalization failed (", u_errorName(status), ")");
  normalized.toUTF8String(*out);
}

}  // namespace
#endif

std::string to_nfc(std::string_view utf8, const std::string& source) {
  bool ascii = true;
  for (unsigned char c : utf8) ascii = ascii && c < 0x80;
  if (ascii) return std::string(utf8);  // ASCII is NFC
#ifdef DS_WITH_ICU
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  DS_CHECK(U_SUCCESS(status), NotSupportedError, source, ": ICU's NFC normalizer is unavailable (",
           u_errorName(status), ")");
  std::string out;
  out.reserve(utf8.size());
  const auto* s = reinterpret_cast<const uint8_t*>(utf8.data());
  const auto n = static_cast<int32_t>(utf8.size());
  int32_t run_start = 0;
  for (int32_t i = 0; i < n;) {
    const int32_t at = i;
    UChar32 c;
    U8_NEXT(s, i, n, c);
    if (c >= 0) continue;
    append_nfc(*nfc, utf8.substr(run_start, at - run_start), &out);
    out.append(utf8.substr(at, i - at));  // the ill-formed bytes, untouched
    run_start = i;
  }
  append_nfc(*nfc, utf8.substr(run_start), &out);
  return out;
#else
  DS_CHECK(false, NotSupportedError, source, ": the NFC normalizer needs ICU, which this build "
           "was made without (install libicu-dev and reconfigure)");
  return {};
#endif
}

}  // namespace deepspeed::examples
