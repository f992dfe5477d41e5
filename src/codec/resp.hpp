// redlimit — a sans-I/O RESP2 codec on hiredis's reader (0.14 or 1.x): bytes in, Reply values out, and
// commands encoded into a caller's buffer. No sockets; the transport feeds it.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "redlimit/options.hpp"
#include "redlimit/detail/reply.hpp"

struct redisReader;  // hiredis/read.h

namespace redlimit::detail {

/// One reply off the wire: a value, or an error reply's text ("CODE message", without the
/// leading '-'). When isError is set, value is Nil.
struct WireReply {
  Reply value;
  bool isError = false;
  std::string error;
};

/// Throws InvalidArgument naming the field: maxBulkBytes == 0, maxElements == 0, maxDepth
/// outside 1..7 (hiredis 0.14's reader nests at most 8 arrays; 7 keeps its own error out of reach,
/// and the same bound holds on hiredis 1.x, which has none).
void checkLimits(const ClientOptions::ReplyLimits& limits);

/// Parses RESP2 replies from bytes fed in any chunking. Not thread-safe; neither copyable nor
/// movable (hiredis's reader points back at it).
///
/// Limits are enforced before anything is allocated for the reply: an array header over
/// maxElements or nested deeper than maxDepth fails when its header line is read, and a bulk
/// length over maxBulkBytes fails as soon as its digits are buffered, without waiting for the
/// payload. maxBulkBytes also bounds status and error lines (a line without its CRLF fails once
/// more than maxBulkBytes bytes of it are buffered), and a length or integer line fails once it
/// is longer than 20 bytes: the buffer never holds much more than one reply's announced size
/// plus what the last feed() added. Memory grows with the bytes received, never with the count an
/// array header announces (arrays grow as their elements arrive): about 100 bytes per element at
/// most, and an element takes at least 3 bytes on the wire.
///
/// Running out of memory anywhere in the parser is an IoError of kind Protocol (so the limiter's
/// FailurePolicy decides the call), never std::bad_alloc: the stream is lost as for bytes that
/// are not RESP2.
class ReplyParser {
 public:
  /// Throws InvalidArgument for limits checkLimits refuses.
  explicit ReplyParser(const ClientOptions::ReplyLimits& limits);
  ~ReplyParser();
  ReplyParser(const ReplyParser&) = delete;
  ReplyParser& operator=(const ReplyParser&) = delete;

  /// Adds `size` bytes (copied). Throws IoError (Protocol) if the parser already failed.
  void feed(const char* data, std::size_t size);

  /// The next complete reply, or std::nullopt when more bytes are needed. Call it until it
  /// returns std::nullopt after each feed(): limits are checked here. Throws IoError (Protocol) for
  /// bytes that are not RESP2 (with hiredis's text when hiredis found it; RESP3 types, which
  /// hiredis 1.x reads, with the text hiredis 0.14 gives for them), or for a reply over a
  /// limit: the message names the limit, the value announced and the limit, e.g. "reply announces
  /// an array of 2147483647 elements, more than ClientOptions::ReplyLimits::maxElements (1048576)". After it
  /// threw once, every later call (and feed()) throws IoError (Protocol): the stream is lost. Out of
  /// memory is an IoError (Protocol) too ("out of memory building a reply ...").
  [[nodiscard]] std::optional<WireReply> next();

  /// The elements the reply being built has room for, summed over its open arrays: what the
  /// parser allocated for array elements (for tests of its memory bound).
  [[nodiscard]] std::size_t elementCapacity() const noexcept;

 private:
  struct Callbacks;  // hiredis's redisReplyObjectFunctions, defined in resp.cpp

  // The object an element at `level` (0 = the root) is built in. Arrays open at that level or
  // deeper are complete and move into their parents first.
  [[nodiscard]] Reply* scalarSlot(std::size_t level);
  [[nodiscard]] Reply* arraySlot(std::size_t level);
  [[nodiscard]] Reply* beginAt(std::size_t level);
  void closeFrom(std::size_t level);
  [[nodiscard]] std::string outOfMemoryText() const;
  void checkWaitingItem();
  void checkNumberLine(std::string_view pending, const char* noun, const char* unit, std::size_t limit,
                       const char* limitName);
  [[noreturn]] void fail(std::string detail);
  [[noreturn]] void throwFailed() const;
  void release() noexcept;

  ClientOptions::ReplyLimits limits_;
  redisReader* reader_ = nullptr;            // null once failed: its buffer is released at once
  static constexpr std::size_t kLevels = 8;  // arrays nest at most 7 deep (checkLimits)
  std::array<Reply, kLevels> open_;          // [0] the reply being built, [i] its open array at level i
  std::array<bool, kLevels> live_{};         // open_[i] (i >= 1) holds an array not yet in open_[i-1]
  bool replyIsError_ = false;                // the reply being built holds an error reply
  std::string replyError_;                   // its text (the first one, for nested errors)
  std::string refusal_;                      // why a callback refused to build an object
  bool outOfMemory_ = false;                 // a callback caught std::bad_alloc
  bool failed_ = false;                      // the stream is lost
  std::string failure_;                      // what went wrong, for the later calls' messages
};

/// Appends the RESP encoding of argv (a multi-bulk command of argc arguments, any bytes) to out:
/// the bytes hiredis's redisFormatCommandArgv makes, in one allocation and without its sprintf per
/// argument (which cost about a quarter of a caller's CPU per decision). Throws InvalidArgument for
/// argc == 0 or an encoding over INT_MAX bytes (hiredis's bound), std::bad_alloc when out of memory.
void appendCommand(std::string& out, const std::string_view* argv, std::size_t argc);

}  // namespace redlimit::detail
