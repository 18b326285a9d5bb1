// A strict RFC 8259 JSON parser: the manifest is written by our own writer, so anything else is corruption and is
// refused with the byte offset. Nesting is bounded so a hostile file cannot overflow the stack.
#include "artifact/json.h"

#include <charconv>
#include <cmath>
#include <string>

namespace ninfer::json {

namespace {

const char* kind_name(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::Null: return "null";
    case Value::Kind::Bool: return "a boolean";
    case Value::Kind::Number: return "a number";
    case Value::Kind::String: return "a string";
    case Value::Kind::Array: return "an array";
    case Value::Kind::Object: return "an object";
  }
  return "?";
}

[[noreturn]] void wrong_kind(Value::Kind have, const char* want) {
  throw TypeError(std::string("expected ") + want + ", found " + kind_name(have));
}

constexpr int kMaxDepth = 256;

}  // namespace

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Value parse_document() {
    Value v = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("trailing characters after the JSON value");
    return v;
  }

 private:
  std::string_view text_;
  size_t pos_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw ParseError("invalid JSON at byte " + std::to_string(pos_) + ": " + what);
  }

  void skip_space() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  void expect_literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) fail("unexpected token");
    pos_ += word.size();
  }

  Value parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
    skip_space();
    if (pos_ >= text_.size()) fail("unexpected end of input");
    Value v;
    switch (text_[pos_]) {
      case 'n': expect_literal("null"); return v;
      case 't': expect_literal("true"); v.kind_ = Value::Kind::Bool; v.bool_ = true; return v;
      case 'f': expect_literal("false"); v.kind_ = Value::Kind::Bool; return v;
      case '"': v.kind_ = Value::Kind::String; v.string_ = parse_string(); return v;
      case '[': return parse_array(depth);
      case '{': return parse_object(depth);
      default: return parse_number();
    }
  }

  Value parse_array(int depth) {
    Value v;
    v.kind_ = Value::Kind::Array;
    ++pos_;
    skip_space();
    if (peek() == ']') { ++pos_; return v; }
    while (true) {
      v.array_.push_back(parse_value(depth + 1));
      skip_space();
      const char c = peek();
      ++pos_;
      if (c == ']') return v;
      if (c != ',') { --pos_; fail("expected ',' or ']' in an array"); }
    }
  }

  Value parse_object(int depth) {
    Value v;
    v.kind_ = Value::Kind::Object;
    ++pos_;
    skip_space();
    if (peek() == '}') { ++pos_; return v; }
    while (true) {
      skip_space();
      if (peek() != '"') fail("expected a string key");
      std::string key = parse_string();
      skip_space();
      if (peek() != ':') fail("expected ':' after an object key");
      ++pos_;
      Value item = parse_value(depth + 1);
      if (!v.object_.emplace(std::move(key), std::move(item)).second) fail("duplicate object key");
      skip_space();
      const char c = peek();
      ++pos_;
      if (c == '}') return v;
      if (c != ',') { --pos_; fail("expected ',' or '}' in an object"); }
    }
  }

  unsigned parse_hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      code <<= 4;
      if (c >= '0' && c <= '9') code |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') code |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') code |= unsigned(c - 'A' + 10);
      else fail("bad hex digit in a \\u escape");
    }
    return code;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xc0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += char(0xe0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    } else {
      out += char(0xf0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3f));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    }
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      // Copy the run of plain characters in one go: tokenizer.json strings are megabytes long.
      const size_t start = pos_;
      while (pos_ < text_.size() && text_[pos_] != '"' && text_[pos_] != '\\' &&
             static_cast<unsigned char>(text_[pos_]) >= 0x20)
        ++pos_;
      out.append(text_.data() + start, pos_ - start);
      if (pos_ >= text_.size()) fail("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (c != '\\') { --pos_; fail("control character in a string"); }
      if (pos_ >= text_.size()) fail("unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = parse_hex4();
          if (cp >= 0xd800 && cp < 0xdc00) {  // a high surrogate must be followed by a low one
            if (text_.substr(pos_, 2) != "\\u") fail("unpaired surrogate in a \\u escape");
            pos_ += 2;
            const unsigned low = parse_hex4();
            if (low < 0xdc00 || low >= 0xe000) fail("unpaired surrogate in a \\u escape");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            fail("unpaired surrogate in a \\u escape");
          }
          append_utf8(out, cp);
          break;
        }
        default: --pos_; fail("unknown escape");
      }
    }
  }

  Value parse_number() {
    // Validate the JSON grammar (from_chars alone would accept "inf", leading '+', "1.", ...).
    const size_t start = pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ - from;
    };
    if (peek() == '-') ++pos_;
    if (peek() == '0') ++pos_;
    else if (digits() == 0) fail("unexpected character");
    if (peek() == '.') {
      ++pos_;
      if (digits() == 0) fail("expected digits after '.'");
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (digits() == 0) fail("expected digits in an exponent");
    }
    Value v;
    v.kind_ = Value::Kind::Number;
    const auto result = std::from_chars(text_.data() + start, text_.data() + pos_, v.number_);
    if (result.ec != std::errc() || !std::isfinite(v.number_)) {
      pos_ = start;
      fail("number out of range");
    }
    return v;
  }
};

Value Value::parse(std::string_view text) { return Parser(text).parse_document(); }

bool Value::as_bool() const {
  if (kind_ != Kind::Bool) wrong_kind(kind_, "a boolean");
  return bool_;
}

double Value::as_number() const {
  if (kind_ != Kind::Number) wrong_kind(kind_, "a number");
  return number_;
}

int64_t Value::as_int() const {
  const double n = as_number();
  // 2^53 bounds the integers a double holds exactly; beyond it "integer" means nothing.
  if (n != std::floor(n) || std::fabs(n) > 9007199254740992.0)
    throw TypeError("expected an integer, found " + std::to_string(n));
  return int64_t(n);
}

const std::string& Value::as_string() const {
  if (kind_ != Kind::String) wrong_kind(kind_, "a string");
  return string_;
}

const std::vector<Value>& Value::as_array() const {
  if (kind_ != Kind::Array) wrong_kind(kind_, "an array");
  return array_;
}

const std::map<std::string, Value>& Value::as_object() const {
  if (kind_ != Kind::Object) wrong_kind(kind_, "an object");
  return object_;
}

bool Value::contains(const std::string& key) const {
  return kind_ == Kind::Object && object_.count(key) != 0;
}

const Value& Value::operator[](const std::string& key) const {
  const auto& object = as_object();
  const auto it = object.find(key);
  if (it == object.end()) throw TypeError("missing key \"" + key + "\"");
  return it->second;
}

const Value& Value::operator[](size_t index) const {
  const auto& array = as_array();
  if (index >= array.size())
    throw TypeError("index " + std::to_string(index) + " out of range (size " + std::to_string(array.size()) + ")");
  return array[index];
}

size_t Value::size() const {
  if (kind_ == Kind::Array) return array_.size();
  if (kind_ == Kind::Object) return object_.size();
  wrong_kind(kind_, "an array or an object");
}

namespace {
// The value under `key` when present and not null; nullptr otherwise.
const Value* present(const Value& v, const std::string& key) {
  if (!v.contains(key)) return nullptr;
  const Value& item = v[key];
  return item.is_null() ? nullptr : &item;
}

// Re-throws a TypeError with the key that was being read, so the message says where the problem is.
template <typename F>
auto with_key(const std::string& key, F&& read) {
  try {
    return read();
  } catch (const TypeError& e) {
    throw TypeError("\"" + key + "\": " + e.what());
  }
}
}  // namespace

double Value::number_or(const std::string& key, double fallback) const {
  const Value* v = present(*this, key);
  return v ? with_key(key, [&] { return v->as_number(); }) : fallback;
}

int64_t Value::int_or(const std::string& key, int64_t fallback) const {
  const Value* v = present(*this, key);
  return v ? with_key(key, [&] { return v->as_int(); }) : fallback;
}

bool Value::bool_or(const std::string& key, bool fallback) const {
  const Value* v = present(*this, key);
  return v ? with_key(key, [&] { return v->as_bool(); }) : fallback;
}

std::string Value::string_or(const std::string& key, const std::string& fallback) const {
  const Value* v = present(*this, key);
  return v ? with_key(key, [&] { return v->as_string(); }) : fallback;
}

}  // namespace ninfer::json
