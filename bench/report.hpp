// How certattn-bench reports: results as records (named fields) that become a text table
// on stdout, JSON (written by hand, no dependency), CSV, and PNG plots drawn by gnuplot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace certattn::bench {

/// One result row: named values in a fixed order (the JSON keys and CSV columns).
struct field {
  std::string name;
  std::variant<double, std::uint64_t, std::string> value;
};
using record = std::vector<field>;

/// A JSON document built in order. Containers opened `inline_` print on one line.
class json_writer {
 public:
  json_writer& begin_object(bool inline_ = false);
  json_writer& end_object();
  json_writer& begin_array(bool inline_ = false);
  json_writer& end_array();
  json_writer& key(std::string_view k);
  json_writer& value(double x);  // non-finite -> null
  json_writer& value(std::uint64_t x);
  json_writer& value(std::string_view s);
  json_writer& value(const char* s) { return value(std::string_view(s)); }
  json_writer& value(bool b);
  json_writer& fields(const record& r);  // every field as key: value
  const std::string& str() const noexcept { return out_; }

  static std::string escape(std::string_view s);  // with the quotes

 private:
  void open(char c, bool inline_);
  void close(char c);
  void element();  // comma and newline/indent before a new element
  struct level {
    bool first = true, inline_ = false;
  };
  std::string out_;
  std::vector<level> stack_;
  bool after_key_ = false;
};

/// Writes `text` to `path`; throws certattn::error if it cannot.
void write_file(const std::string& path, const std::string& text);

/// CSV with a header row from the first record's names (RFC 4180 quoting).
std::string to_csv(const std::vector<record>& rows);

/// Ends a document opened with j.begin_object(): appends "rows", one inline object per
/// record, closes it, writes it to `path` and prints "wrote <path>".
void finish_json(json_writer& j, const std::vector<record>& rows, const std::string& path);

/// Writes `rows` as CSV (to_csv) to `path` and prints "wrote <path>".
void write_csv(const std::string& path, const std::vector<record>& rows);

/// A text table with right-aligned columns (a header starting with '<' is left-aligned;
/// the '<' is not printed).
class text_table {
 public:
  explicit text_table(std::vector<std::string> headers);
  void add_row(std::vector<std::string> cells);
  void print(std::FILE* out) const;

 private:
  std::vector<std::string> headers_;
  std::vector<bool> left_;
  std::vector<std::vector<std::string>> rows_;
};

/// printf into a std::string.
std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

struct plot_series {
  std::string title;
  std::vector<double> x, y;
};

struct plot_spec {
  std::string file;  // name inside the plot directory, e.g. "speedup_vs_context.png"
  std::string title, xlabel, ylabel;
  bool log2_x = true;       // contexts double from point to point
  bool y_from_zero = true;
  double hline = -1.0;      // a dashed reference line at this y (e.g. speedup 1); < 0: none
  std::vector<plot_series> series;
};

/// True if an executable `gnuplot` is on PATH.
bool gnuplot_on_path();

/// Pipes `script` into gnuplot. Without gnuplot on PATH, or when it cannot be started, it
/// prints why to stderr (naming --plot) and returns false; a non-zero exit status is
/// reported on stderr. The caller checks which files were written.
bool run_gnuplot(const std::string& script);

/// Draws each plot as a PNG in `dir` (created if missing) by piping a script into
/// gnuplot, then checks that every file exists and is not empty. Without gnuplot on PATH
/// it prints why to stderr and writes nothing. Returns the paths written.
std::vector<std::string> write_plots(const std::string& dir, const std::vector<plot_spec>& plots);

}  // namespace certattn::bench
