// The trace reader (example/KPoolTrace.hpp) on inputs fuzz_trace found
// (fuzz/README.md): one TEST per defect, named after the property.

#include "KPoolTrace.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

namespace {

KPoolTrace::TraceError refusal(std::string const& text) {
  std::istringstream in(text);
  try {
    KPoolTrace::parse(in);
  } catch (KPoolTrace::TraceError const& e) {
    return e;
  }
  ADD_FAILURE() << "the trace was accepted";
  return KPoolTrace::TraceError(0, "");
}

// fuzz_trace: a NUL byte in a token cut the refusal's what() at the NUL
// (a C string), so 'trace:LINE: ...' lost its end, and other control bytes
// reached the terminal as they were. They are escaped as \xHH.
TEST(TraceReader, RefusalEscapesControlBytesOfTheInput) {
  std::string const text = std::string("kpool-trace 1\nhead_dim 4\nkpool 2\ndtype f") +
                           '\0' + "3\x1b\nslots 1\nseed 1\n";
  KPoolTrace::TraceError const e = refusal(text);
  EXPECT_EQ(e.line, 4);
  std::string const what = e.what();
  EXPECT_EQ(what, "trace:4: " + e.message);
  EXPECT_EQ(what.find('\0'), std::string::npos);
  EXPECT_EQ(what.find('\x1b'), std::string::npos);
  EXPECT_NE(what.find("'f\\x003\\x1b'"), std::string::npos) << what;
}

// Printable bytes, UTF-8 included, stay as they are.
TEST(TraceReader, RefusalKeepsPrintableBytes) {
  KPoolTrace::TraceError const e =
      refusal("kpool-trace 1\nhead_dim 4\nkpool 2\ndtype f\xc3\xa9\nslots 1\nseed 1\n");
  EXPECT_NE(std::string(e.what()).find("'f\xc3\xa9'"), std::string::npos) << e.what();
}

}  // namespace
