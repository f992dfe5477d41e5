#include "codec/resp.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <hiredis/read.h>

#include "redlimit/errors.hpp"

// ReplyParser reads redisReader's public fields (ridx, the task stack, buf, pos, len) to see which
// item the reader waits on, and fills a redisReplyObjectFunctions by member name. Between 0.14
// and 1.x the stack went from rstack[9] to a growable array of pointers (task), createArray's
// count from int to size_t, and RESP3 types (createDouble, createBool) came in; read.h keeps
// those fields from 1.0.0 to 1.2.0. Tested: 0.14.1 (Debian 12) and 1.2.0 (scripts/ci-hiredis12.sh).
// A later release must have its read.h checked against the uses below before it is let in.
static_assert((HIREDIS_MAJOR == 0 && HIREDIS_MINOR == 14) || (HIREDIS_MAJOR == 1 && HIREDIS_MINOR <= 2),
              "src/codec/resp.cpp knows the redisReader of hiredis 0.14 and 1.0-1.2 only");

namespace redlimit::detail {

namespace {

// The longest length or integer line: "-9223372036854775808".
constexpr std::size_t kMaxNumberLine = 20;
// hiredis 0.14's reader nests at most 8 arrays (1.x has no bound); limits stay below, so that the
// limit is the same on both and our message comes first.
constexpr int kMaxDepth = 7;

bool isDigit(char c) noexcept { return c >= '0' && c <= '9'; }

const char* lineKind(int type) noexcept { return type == REDIS_REPLY_ERROR ? "an error line" : "a status line"; }

// hiredis 1.x also reads RESP3 and hands its types to the callbacks and the task stack. This
// codec is RESP2: it refuses them with the text hiredis 0.14 gives for the same type byte, so the
// two versions fail alike. The type byte of a RESP3 task type, 0 for a RESP2 one.
char resp3TypeByte(int type) noexcept {
#if HIREDIS_MAJOR >= 1
  switch (type) {
    case REDIS_REPLY_DOUBLE:
      return ',';
    case REDIS_REPLY_NIL:
      return '_';
    case REDIS_REPLY_BOOL:
      return '#';
    case REDIS_REPLY_MAP:
      return '%';
    case REDIS_REPLY_SET:
      return '~';
    case REDIS_REPLY_ATTR:
      return '|';
    case REDIS_REPLY_PUSH:
      return '>';
    case REDIS_REPLY_BIGNUM:
      return '(';
    case REDIS_REPLY_VERB:
      return '=';
    default:
      return 0;
  }
#else
  (void)type;  // 0.14 refuses RESP3 type bytes itself
  return 0;
#endif
}

std::string notResp2Type(char typeByte) {
  return fmt::format("bytes that are not RESP2: Protocol error, got \"{}\" as reply type byte", typeByte);
}

}  // namespace

void checkLimits(const ClientOptions::ReplyLimits& limits) {
  if (limits.maxBulkBytes == 0)
    throw InvalidArgument("redlimit: ClientOptions::ReplyLimits::maxBulkBytes must be >= 1, got 0");
  if (limits.maxElements == 0)
    throw InvalidArgument("redlimit: ClientOptions::ReplyLimits::maxElements must be >= 1, got 0");
  if (limits.maxDepth < 1 || limits.maxDepth > kMaxDepth) {
    throw InvalidArgument(fmt::format("redlimit: ClientOptions::ReplyLimits::maxDepth must be in 1..{}, got {}",
                                      kMaxDepth, limits.maxDepth));
  }
}

// hiredis builds replies through these. They must not throw through hiredis's C frames: a refusal
// (a limit) or an exception is recorded on the parser and the callback returns NULL, which makes
// the reader fail ("Out of memory"); next() then reports what was recorded instead.
// Memory grows with the bytes received, never with a count a header announces: no array is
// reserved at its announced size (70 bytes of "*1048576\r\n" nested 7 deep once reserved 600 MB).
// An array being built lives in open_ at its level (the root at 0), where hiredis's pointer to it
// stays valid however its parent's elements grow; it moves into its parent when the parent's next
// element begins or the reply completes (hiredis builds depth first, so an open array is always
// its parent's last element). Scalars go straight into their parent's elements, which grow as
// vectors do; hiredis never uses a scalar's pointer after its callback returns.
struct ReplyParser::Callbacks {
  static ReplyParser& parser(const redisReadTask* task) { return *static_cast<ReplyParser*>(task->privdata); }
  // The level of the object a task builds: 0 for the root, 1 for its elements, ...
  static std::size_t levelOf(const redisReadTask* task) {
    std::size_t level = 0;
    for (const redisReadTask* up = task->parent; up != nullptr; up = up->parent) ++level;
    return level;
  }

  template <class Build>
  static void* guarded(const redisReadTask* task, Build&& build) noexcept {
    ReplyParser& p = parser(task);
    try {
      return build(p);
    } catch (const std::bad_alloc&) {
      p.outOfMemory_ = true;
      return nullptr;
    } catch (const std::exception& e) {
      p.refusal_ = fmt::format("a reply could not be built: {}", e.what());
      return nullptr;
    } catch (...) {
      p.refusal_ = "a reply could not be built";
      return nullptr;
    }
  }

  // A task of a RESP3 type (hiredis 1.x only) fails the stream.
  static void* refuseResp3(const redisReadTask* task) {
    return guarded(task, [&](ReplyParser& p) -> void* {
      p.refusal_ = notResp2Type(resp3TypeByte(task->type));
      return nullptr;
    });
  }

  static void* createString(const redisReadTask* task, char* str, std::size_t len) {
    if (task->type != REDIS_REPLY_STRING && task->type != REDIS_REPLY_STATUS && task->type != REDIS_REPLY_ERROR) {
      return refuseResp3(task);  // a big number or a verbatim string
    }
    return guarded(task, [&](ReplyParser& p) -> void* {
      if (len > p.limits_.maxBulkBytes) {
        p.refusal_ =
            task->type == REDIS_REPLY_STRING
                ? fmt::format(
                      "reply announces a bulk string of {} bytes, more than ClientOptions::ReplyLimits::maxBulkBytes "
                      "({})",
                      len, p.limits_.maxBulkBytes)
                : fmt::format("reply has {} of {} bytes, more than ClientOptions::ReplyLimits::maxBulkBytes ({})",
                              lineKind(task->type), len, p.limits_.maxBulkBytes);
        return nullptr;
      }
      // hiredis checked that the payload and two more bytes are buffered, but not what they are.
      if (task->type == REDIS_REPLY_STRING && (str[len] != '\r' || str[len + 1] != '\n')) {
        p.refusal_ = fmt::format("bytes that are not RESP2: a bulk string of {} bytes is not followed by CRLF", len);
        return nullptr;
      }
      // hiredis 0.14 ends a line at its first CRLF and passes a lone CR or LF through; 1.x
      // refuses both ("Bad simple string value"). Refused here too, so both versions agree.
      if (task->type != REDIS_REPLY_STRING &&
          (std::memchr(str, '\r', len) != nullptr || std::memchr(str, '\n', len) != nullptr)) {
        p.refusal_ = fmt::format("bytes that are not RESP2: {} holds a CR or LF byte", lineKind(task->type));
        return nullptr;
      }
      Reply* slot = p.scalarSlot(levelOf(task));
      if (task->type == REDIS_REPLY_ERROR) {
        if (!p.replyIsError_) {  // the first error of the reply speaks for it
          p.replyIsError_ = true;
          p.replyError_.assign(str, len);
        }
        return slot;  // stays Nil
      }
      slot->type = task->type == REDIS_REPLY_STATUS ? Reply::Type::Status : Reply::Type::String;
      slot->str.assign(str, len);
      return slot;
    });
  }

  // Count: int in hiredis 0.14, size_t in 1.x (deduced from the table's member in makeTable).
  template <class Count>
  static void* createArray(const redisReadTask* task, Count count) {
    if (task->type != REDIS_REPLY_ARRAY) return refuseResp3(task);  // a map, set or push
    return guarded(task, [&](ReplyParser& p) -> void* {
      if constexpr (std::is_signed_v<Count>) {
        // hiredis calls createNil for "*-1" and refuses other negative counts; never seen here.
        if (count < 0) {
          p.refusal_ = fmt::format("bytes that are not RESP2: an array of {} elements", count);
          return nullptr;
        }
      }
      const std::size_t level = levelOf(task);
      const std::size_t depth = level + 1;
      if (depth > static_cast<std::size_t>(p.limits_.maxDepth)) {
        p.refusal_ =
            fmt::format("reply announces arrays nested {} deep, more than ClientOptions::ReplyLimits::maxDepth ({})",
                        depth, p.limits_.maxDepth);
        return nullptr;
      }
      const auto elements = static_cast<std::size_t>(count);
      if (elements > p.limits_.maxElements) {
        p.refusal_ = fmt::format(
            "reply announces an array of {} elements, more than ClientOptions::ReplyLimits::maxElements ({})", elements,
            p.limits_.maxElements);
        return nullptr;
      }
      Reply* slot = p.arraySlot(level);
      slot->type = Reply::Type::Array;  // its elements grow as they arrive
      return slot;
    });
  }

  static void* createInteger(const redisReadTask* task, long long value) {
    return guarded(task, [&](ReplyParser& p) -> void* {
      Reply* slot = p.scalarSlot(levelOf(task));
      slot->type = Reply::Type::Integer;
      slot->integer = static_cast<std::int64_t>(value);
      return slot;
    });
  }

  // "$-1" and "*-1" (task type string or array); hiredis 1.x also calls it for RESP3's "_" and
  // a nil map, set or push.
  static void* createNil(const redisReadTask* task) {
    if (task->type != REDIS_REPLY_STRING && task->type != REDIS_REPLY_ARRAY) return refuseResp3(task);
    return guarded(task, [&](ReplyParser& p) -> void* { return p.scalarSlot(levelOf(task)); });
  }

  // RESP3 only (hiredis 1.x): refused.
  static void* createDouble(const redisReadTask* task, double /*value*/, char* /*text*/, std::size_t /*len*/) {
    return refuseResp3(task);
  }
  static void* createBool(const redisReadTask* task, int /*value*/) { return refuseResp3(task); }

  // hiredis frees only the root it holds (&open_[0]), on an error or in redisReaderFree.
  static void freeObject(void* object) { *static_cast<Reply*>(object) = Reply{}; }

  // Filled by member name: the members and their order differ between hiredis 0.14 and 1.x. A
  // member left null would make hiredis 1.x build a dummy object for that type.
  static redisReplyObjectFunctions makeTable() noexcept {
    redisReplyObjectFunctions table{};
    table.createString = &createString;
    table.createArray = &createArray;
    table.createInteger = &createInteger;
    table.createNil = &createNil;
#if HIREDIS_MAJOR >= 1
    table.createDouble = &createDouble;
    table.createBool = &createBool;
#endif
    table.freeObject = &freeObject;
    return table;
  }

  static const redisReplyObjectFunctions kTable;
};

const redisReplyObjectFunctions ReplyParser::Callbacks::kTable = makeTable();

ReplyParser::ReplyParser(const ClientOptions::ReplyLimits& limits) : limits_(limits) {
  checkLimits(limits_);
  // The reader keeps hiredis's default maxbuf (16 KiB): a larger idle buffer is released.
  // hiredis takes a non-const table but never writes through it.
  reader_ = redisReaderCreateWithFunctions(const_cast<redisReplyObjectFunctions*>(&Callbacks::kTable));
  if (reader_ == nullptr) throw IoError(ErrorKind::Protocol, "", "redlimit: out of memory creating a reply reader");
  reader_->privdata = this;
}

ReplyParser::~ReplyParser() { release(); }

void ReplyParser::release() noexcept {
  if (reader_ != nullptr) {
    redisReaderFree(reader_);
    reader_ = nullptr;
  }
  for (Reply& r : open_) r = Reply{};
  live_.fill(false);
}

void ReplyParser::fail(std::string detail) {
  failed_ = true;
  failure_ = std::move(detail);
  release();
  throw IoError(ErrorKind::Protocol, "", fmt::format("redlimit: {}", failure_));
}

void ReplyParser::throwFailed() const {
  throw IoError(ErrorKind::Protocol, "", fmt::format("redlimit: the reply stream was lost earlier: {}", failure_));
}

void ReplyParser::feed(const char* data, std::size_t size) {
  if (failed_) throwFailed();
  if (size == 0) return;
  if (redisReaderFeed(reader_, data, size) != REDIS_OK) {
    fail(fmt::format("hiredis could not buffer a reply: {}", reader_->errstr));
  }
}

std::optional<WireReply> ReplyParser::next() {
  if (failed_) throwFailed();
  void* object = nullptr;
  if (redisReaderGetReply(reader_, &object) != REDIS_OK) {
    if (outOfMemory_) fail(outOfMemoryText());
    if (!refusal_.empty()) fail(std::exchange(refusal_, std::string()));
    // hiredis's own allocations fail with "Out of memory" too: an IoError (Protocol) like the rest.
    fail(fmt::format("bytes that are not RESP2: {}", reader_->errstr));
  }
  if (object == nullptr) {
    checkWaitingItem();
    return std::nullopt;
  }
  try {
    closeFrom(1);
  } catch (const std::bad_alloc&) {
    fail(outOfMemoryText());
  }
  std::optional<WireReply> out(std::in_place);
  if (replyIsError_) {
    out->isError = true;
    out->error = std::move(replyError_);
    open_[0] = Reply{};
  } else {
    out->value = std::move(open_[0]);
  }
  return out;
}

std::string ReplyParser::outOfMemoryText() const {
  return fmt::format("out of memory building a reply ({} bytes were buffered)",
                     reader_ != nullptr ? reader_->len : std::size_t{0});
}

std::size_t ReplyParser::elementCapacity() const noexcept {
  std::size_t n = 0;
  for (const Reply& r : open_) n += r.elements.capacity();
  return n;
}

void ReplyParser::closeFrom(std::size_t level) {
  for (std::size_t i = open_.size() - 1; i >= level && i > 0; --i) {
    if (!live_[i]) continue;
    open_[i - 1].elements.push_back(std::move(open_[i]));
    open_[i] = Reply{};
    live_[i] = false;
  }
}

Reply* ReplyParser::beginAt(std::size_t level) {
  if (level == 0) {  // a new reply begins
    for (Reply& r : open_) r = Reply{};
    live_.fill(false);
    replyIsError_ = false;
    return &open_[0];
  }
  closeFrom(level);  // open arrays at this level or deeper are complete: this element follows them
  return nullptr;
}

Reply* ReplyParser::scalarSlot(std::size_t level) {
  if (Reply* root = beginAt(level)) return root;
  auto& elements = open_[level - 1].elements;
  elements.emplace_back();
  return &elements.back();
}

Reply* ReplyParser::arraySlot(std::size_t level) {
  if (Reply* root = beginAt(level)) return root;
  live_[level] = true;
  return &open_[level];
}

// hiredis waits for the rest of the item at r.pos. A bulk string waits for its whole payload
// before createString is called, so its length is checked here, from the header bytes, as soon
// as they are buffered; lines without their CRLF are bounded too. Items before this one were
// complete and went through the callbacks; bytes after it belong to it, so no later header is
// buffered unchecked.
void ReplyParser::checkWaitingItem() {
  const redisReader& r = *reader_;
  if (r.ridx < 0) return;
#if HIREDIS_MAJOR >= 1
  const int type = r.task[r.ridx]->type;
#else
  const int type = r.rstack[r.ridx].type;
#endif
  if (type < 0) return;                                                 // waiting for a type byte
  if (const char byte = resp3TypeByte(type)) fail(notResp2Type(byte));  // its rest is not waited for
  const std::string_view pending(r.buf + r.pos, r.len - r.pos);
  switch (type) {
    case REDIS_REPLY_STRING:
      checkNumberLine(pending, "a bulk string", "bytes", limits_.maxBulkBytes, "maxBulkBytes");
      break;
    case REDIS_REPLY_ARRAY:
      checkNumberLine(pending, "an array", "elements", limits_.maxElements, "maxElements");
      break;
    case REDIS_REPLY_INTEGER:
      checkNumberLine(pending, nullptr, nullptr, 0, nullptr);
      break;
    default: {  // status or error line: pending holds no CRLF, perhaps a final '\r'
      const std::size_t atLeast = pending.size() - (!pending.empty() && pending.back() == '\r' ? 1 : 0);
      if (atLeast > limits_.maxBulkBytes) {
        fail(fmt::format("reply has {} of at least {} bytes, more than ClientOptions::ReplyLimits::maxBulkBytes ({})",
                         lineKind(type), atLeast, limits_.maxBulkBytes));
      }
    }
  }
}

// `pending` starts with a length or integer line, perhaps not complete yet. Fails when (with a
// limitName) its digits already exceed the limit, or when the line is too long to be a number.
void ReplyParser::checkNumberLine(std::string_view pending, const char* noun, const char* unit, std::size_t limit,
                                  const char* limitName) {
  const std::size_t scanned = std::min(pending.size(), kMaxNumberLine + 1);
  const bool ended = std::memchr(pending.data(), '\r', scanned) != nullptr;
  if (limitName != nullptr) {
    std::size_t digits = 0;
    std::size_t value = 0;
    bool overflow = false;
    for (; digits < scanned && isDigit(pending[digits]); ++digits) {
      const auto d = static_cast<std::size_t>(pending[digits] - '0');
      if (value > (SIZE_MAX - d) / 10) overflow = true;
      value = value * 10 + d;
    }
    // No digits: "-1" (nil), or bytes hiredis refuses once the line is complete.
    if (digits > 0 && (overflow || value > limit)) {
      fail(fmt::format("reply announces {} of {}{} {}, more than ClientOptions::ReplyLimits::{} ({})", noun,
                       ended ? "" : "at least ", pending.substr(0, digits), unit, limitName, limit));
    }
  }
  if (!ended && scanned > kMaxNumberLine) {
    fail(fmt::format("bytes that are not RESP2: a length or integer line longer than {} bytes", kMaxNumberLine));
  }
}

void appendCommand(std::string& out, const std::string_view* argv, std::size_t argc) {
  if (argc == 0) throw InvalidArgument("redlimit: a command needs at least one argument");
  // RESP2 multi-bulk: "*<argc>\r\n", then "$<len>\r\n<bytes>\r\n" per argument. The size is
  // summed first (one allocation); it stays within INT_MAX, the bound hiredis's own encoder had.
  auto digits = [](std::size_t v) {
    std::size_t d = 1;
    while (v >= 10) {
      v /= 10;
      ++d;
    }
    return d;
  };
  std::size_t size = 1 + digits(argc) + 2;
  for (std::size_t i = 0; i < argc; ++i) {
    const std::size_t one = 1 + digits(argv[i].size()) + 2 + argv[i].size() + 2;
    if (one > static_cast<std::size_t>(INT_MAX) - size) {
      throw InvalidArgument(fmt::format("redlimit: a command's encoding may be at most {} bytes", INT_MAX));
    }
    size += one;
  }
  const std::size_t at = out.size();
  out.resize(at + size);
  char* p = out.data() + at;
  auto header = [&p](char kind, std::size_t n) {
    *p++ = kind;
    const fmt::format_int text(n);
    std::memcpy(p, text.data(), text.size());
    p += text.size();
    *p++ = '\r';
    *p++ = '\n';
  };
  header('*', argc);
  for (std::size_t i = 0; i < argc; ++i) {
    header('$', argv[i].size());
    if (!argv[i].empty()) std::memcpy(p, argv[i].data(), argv[i].size());
    p += argv[i].size();
    *p++ = '\r';
    *p++ = '\n';
  }
}

}  // namespace redlimit::detail
