// A TOML document as the spec's schema reads it: plain values with their positions, so that only
// document.cpp includes toml++ (2.4 s per translation unit).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mltrain::spec::detail {

struct Pos {
  uint32_t line = 0, column = 0;
};

struct Value {
  enum class Kind { string, integer, floating, boolean, array, table, datetime };
  struct Field;
  Kind kind = Kind::table;
  Pos at;
  std::string str;
  int64_t integer = 0;
  double floating = 0;
  bool boolean = false;
  std::vector<Value> items;   // an array's
  std::vector<Field> fields;  // a table's, in toml++'s order (by key)

  bool is(Kind k) const { return kind == k; }
  // The field named `key`, or nullptr.
  const Value* find(const std::string& key) const;
};

struct Value::Field {
  std::string key;
  Pos at;  // where the key is written
  Value value;
};

// A parsed file: its name as errors show it ("<spec>" when it has none) and its root table.
struct Document {
  std::string file;
  Value root;
  std::string where(Pos p) const {
    return file + ":" + std::to_string(p.line) + ":" + std::to_string(p.column);
  }
};

// Parses TOML text; a syntax error throws mltrain::Error "file:line:col: what".
Document parse_document(const std::string& text, const std::string& path);

// A table as TOML text (toml++'s formatting).
std::string write_document(const Value& root);

// "a string", "an integer", ... as error messages name a value's type.
std::string type_of(const Value& v);

// Builders for write_document's input.
Value string_value(std::string s);
Value integer_value(int64_t i);
Value floating_value(double f);
Value boolean_value(bool b);
Value array_value(std::vector<Value> items);
Value table_value();
// Sets `key` of table `t` (replacing a field of that name).
void set_field(Value& t, const std::string& key, Value v);

}  // namespace mltrain::spec::detail
