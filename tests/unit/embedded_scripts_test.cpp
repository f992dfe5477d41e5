// The scripts as Redis runs them (cmake/EmbedLua.cmake): every lua/<name>.lua is embedded, the
// build tree's lua/<name>.lua holds exactly the embedded text (so a script error's
// `user_script:LINE` can be looked up there), its SHA1 is the one EVALSHA sends, and up to the
// script's `-- include:` line its lines are those of the source file.
#include <gtest/gtest.h>

#include <openssl/evp.h>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>

#include "redlimit_lua.hpp"

namespace {

namespace lua = redlimit::detail::lua;

std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "<cannot read " + path.string() + ">";
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string sha1Hex(const std::string& text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(text.data(), text.size(), digest, &size, EVP_sha1(), nullptr) != 1) return "<EVP_Digest failed>";
  static const char* const kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < size; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 0xF];
  }
  return hex;
}

TEST(EmbeddedScripts, EveryScriptOfTheLuaDirectoryIsEmbedded) {
  std::set<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(REDLIMIT_LUA_SOURCE_DIR)) {
    if (entry.is_regular_file() && entry.path().extension() == ".lua") files.insert(entry.path().stem().string());
  }
  std::set<std::string> embedded;
  for (const lua::EmbeddedScript* s : lua::kAll) embedded.insert(s->name);
  EXPECT_EQ(embedded, files);
}

TEST(EmbeddedScripts, BuildTreeHoldsEachComposedScriptWithTheSha1EvalshaSends) {
  for (const lua::EmbeddedScript* s : lua::kAll) {
    SCOPED_TRACE(s->name);
    const std::string composed =
        readFile(std::filesystem::path(REDLIMIT_LUA_COMPOSED_DIR) / (std::string(s->name) + ".lua"));
    EXPECT_EQ(composed, s->source);
    EXPECT_EQ(sha1Hex(composed), s->sha1);
  }
}

TEST(EmbeddedScripts, ComposedScriptIsTheSourceWithItsLibrariesAfterTheIncludeLine) {
  for (const lua::EmbeddedScript* s : lua::kAll) {
    SCOPED_TRACE(s->name);
    const std::string source =
        readFile(std::filesystem::path(REDLIMIT_LUA_SOURCE_DIR) / (std::string(s->name) + ".lua"));
    const std::string composed = s->source;
    const std::string padded = "\n" + source;
    const std::size_t at = padded.find("\n-- include:");
    if (at == std::string::npos) {
      EXPECT_EQ(composed, source);  // nothing included: sent as it is
      continue;
    }
    // Up to the end of the include line every line is the source file's: the same text at the same
    // line numbers. In `source`, the line starts at `at` and its newline is at head - 1.
    const std::size_t head = padded.find('\n', at + 1);
    ASSERT_NE(head, std::string::npos);
    ASSERT_GE(composed.size(), source.size());
    EXPECT_EQ(composed.substr(0, head), source.substr(0, head));
    // Then each library, headed by its marker, in the order the line names them; then the rest.
    const std::size_t colon = at + std::string("-- include:").size();
    std::istringstream names(source.substr(colon, head - 1 - colon));
    std::size_t pos = head;
    for (auto it = std::istream_iterator<std::string>(names); it != std::istream_iterator<std::string>(); ++it) {
      const std::string marker = "-- ==== lib/" + *it + ".lua ====\n";
      EXPECT_EQ(composed.compare(pos, marker.size(), marker), 0) << "expected " << marker << " at offset " << pos;
      pos += marker.size();
      const std::string lib = readFile(std::filesystem::path(REDLIMIT_LUA_SOURCE_DIR) / "lib" / (*it + ".lua"));
      EXPECT_EQ(composed.compare(pos, lib.size(), lib), 0) << "lib/" << *it << ".lua is not there as it is";
      pos += lib.size();
    }
    const std::string rest = "-- ==== " + std::string(s->name) + ".lua, continued ====\n" + source.substr(head);
    EXPECT_EQ(composed.substr(pos), rest);
  }
}

}  // namespace
