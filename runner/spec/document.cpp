// The one translation unit that includes toml++: TOML text to a Document and a Value back to text.
#include "runner/spec/detail/document.h"

#include <toml++/toml.h>

#include <sstream>

#include "runner/common/error.h"

namespace mltrain::spec::detail {
namespace {

Pos pos_of(const toml::source_region& r) { return {r.begin.line, r.begin.column}; }

Value from_node(const toml::node& n) {
  Value v;
  v.at = pos_of(n.source());
  if (auto s = n.as_string()) {
    v.kind = Value::Kind::string, v.str = s->get();
  } else if (auto i = n.as_integer()) {
    v.kind = Value::Kind::integer, v.integer = i->get();
  } else if (auto f = n.as_floating_point()) {
    v.kind = Value::Kind::floating, v.floating = f->get();
  } else if (auto b = n.as_boolean()) {
    v.kind = Value::Kind::boolean, v.boolean = b->get();
  } else if (auto a = n.as_array()) {
    v.kind = Value::Kind::array;
    for (const auto& e : *a) v.items.push_back(from_node(e));
  } else if (auto t = n.as_table()) {
    v.kind = Value::Kind::table;
    for (const auto& [key, node] : *t)
      v.fields.push_back({std::string(key.str()), pos_of(key.source()), from_node(node)});
  } else {
    v.kind = Value::Kind::datetime;
  }
  return v;
}

toml::table to_table(const Value& t);

toml::array to_array(const Value& a) {
  toml::array out;
  for (const auto& e : a.items) switch (e.kind) {
      case Value::Kind::string:
        out.push_back(e.str);
        break;
      case Value::Kind::table:
        out.push_back(to_table(e));
        break;
      default:
        throw Error("internal: only strings and tables are written in arrays", {}, 70);
    }
  return out;
}

toml::table to_table(const Value& t) {
  toml::table out;
  for (const auto& f : t.fields) switch (f.value.kind) {
      case Value::Kind::string:
        out.insert(f.key, f.value.str);
        break;
      case Value::Kind::integer:
        out.insert(f.key, f.value.integer);
        break;
      case Value::Kind::floating:
        out.insert(f.key, f.value.floating);
        break;
      case Value::Kind::boolean:
        out.insert(f.key, f.value.boolean);
        break;
      case Value::Kind::array:
        out.insert(f.key, to_array(f.value));
        break;
      case Value::Kind::table:
        out.insert(f.key, to_table(f.value));
        break;
      case Value::Kind::datetime:
        throw Error("internal: dates are not written", {}, 70);
    }
  return out;
}

std::string file_of(const toml::source_region& r) { return r.path ? *r.path : std::string("<spec>"); }

}  // namespace

const Value* Value::find(const std::string& key) const {
  for (const auto& f : fields)
    if (f.key == key) return &f.value;
  return nullptr;
}

Document parse_document(const std::string& text, const std::string& path) {
  try {
    toml::table root = toml::parse(text, path);
    return {file_of(root.source()), from_node(root)};
  } catch (const toml::parse_error& e) {
    Document at{file_of(e.source()), {}};
    throw Error(at.where(pos_of(e.source())) + ": " + std::string(e.description()),
                "fix the TOML syntax at that spot");
  }
}

std::string write_document(const Value& root) {
  std::ostringstream os;
  os << to_table(root);
  return os.str();
}

std::string type_of(const Value& v) {
  switch (v.kind) {
    case Value::Kind::string:
      return "a string";
    case Value::Kind::integer:
      return "an integer";
    case Value::Kind::floating:
      return "a float";
    case Value::Kind::boolean:
      return "a boolean";
    case Value::Kind::array:
      return "an array";
    case Value::Kind::table:
      return "a table";
    default:
      return "a date/time";
  }
}

Value string_value(std::string s) {
  Value v;
  v.kind = Value::Kind::string, v.str = std::move(s);
  return v;
}
Value integer_value(int64_t i) {
  Value v;
  v.kind = Value::Kind::integer, v.integer = i;
  return v;
}
Value floating_value(double f) {
  Value v;
  v.kind = Value::Kind::floating, v.floating = f;
  return v;
}
Value boolean_value(bool b) {
  Value v;
  v.kind = Value::Kind::boolean, v.boolean = b;
  return v;
}
Value array_value(std::vector<Value> items) {
  Value v;
  v.kind = Value::Kind::array, v.items = std::move(items);
  return v;
}
Value table_value() { return Value{}; }

void set_field(Value& t, const std::string& key, Value v) {
  for (auto& f : t.fields)
    if (f.key == key) {
      f.value = std::move(v);
      return;
    }
  t.fields.push_back({key, {}, std::move(v)});
}

}  // namespace mltrain::spec::detail
