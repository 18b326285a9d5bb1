// A small JSON value and parser for the artifact manifest (no third-party dependency).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ninfer::json {

class ParseError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Access to a missing key or a value of the wrong type throws TypeError with the key path in the message.
class TypeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Value {
 public:
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Value() = default;

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::Null; }
  bool is_number() const { return kind_ == Kind::Number; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_object() const { return kind_ == Kind::Object; }

  bool as_bool() const;
  double as_number() const;
  int64_t as_int() const;            // refuses non-integral numbers
  const std::string& as_string() const;
  const std::vector<Value>& as_array() const;
  const std::map<std::string, Value>& as_object() const;

  bool contains(const std::string& key) const;
  const Value& operator[](const std::string& key) const;  // throws TypeError when absent
  const Value& operator[](size_t index) const;
  size_t size() const;

  // Typed lookups with a default when the key is absent or null.
  double number_or(const std::string& key, double fallback) const;
  int64_t int_or(const std::string& key, int64_t fallback) const;
  bool bool_or(const std::string& key, bool fallback) const;
  std::string string_or(const std::string& key, const std::string& fallback) const;

  static Value parse(std::string_view text);  // throws ParseError with the byte offset

 private:
  friend class Parser;
  Kind kind_ = Kind::Null;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<Value> array_;
  std::map<std::string, Value> object_;
};

}  // namespace ninfer::json
