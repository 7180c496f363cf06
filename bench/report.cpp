// Implementation of report.hpp.
#include "report.hpp"

#include <certattn/common.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace certattn::bench {

// ---- JSON ------------------------------------------------------------------------------------

std::string json_writer::escape(std::string_view s) {
  std::string o = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\b': o += "\\b"; break;
      case '\f': o += "\\f"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
          o += buf;
        } else {
          o += ch;  // UTF-8 passes through unchanged
        }
    }
  }
  return o + "\"";
}

void json_writer::element() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (stack_.empty()) return;
  level& l = stack_.back();
  if (!l.first) out_ += l.inline_ ? ", " : ",";
  if (!l.inline_) out_ += "\n" + std::string(2 * stack_.size(), ' ');
  l.first = false;
}

void json_writer::open(char c, bool inline_) {
  element();
  out_ += c;
  const bool parent_inline = !stack_.empty() && stack_.back().inline_;
  stack_.push_back({true, inline_ || parent_inline});
}

void json_writer::close(char c) {
  CERTATTN_ASSERT(!stack_.empty());
  const level l = stack_.back();
  stack_.pop_back();
  if (!l.inline_ && !l.first) out_ += "\n" + std::string(2 * stack_.size(), ' ');
  out_ += c;
  if (stack_.empty()) out_ += "\n";
}

json_writer& json_writer::begin_object(bool inline_) {
  open('{', inline_);
  return *this;
}
json_writer& json_writer::end_object() {
  close('}');
  return *this;
}
json_writer& json_writer::begin_array(bool inline_) {
  open('[', inline_);
  return *this;
}
json_writer& json_writer::end_array() {
  close(']');
  return *this;
}
json_writer& json_writer::key(std::string_view k) {
  element();
  out_ += escape(k) + ": ";
  after_key_ = true;
  return *this;
}
json_writer& json_writer::value(double x) {
  element();
  if (!std::isfinite(x)) {
    out_ += "null";
  } else {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", x);
    out_ += buf;
  }
  return *this;
}
json_writer& json_writer::value(std::uint64_t x) {
  element();
  out_ += std::to_string(x);
  return *this;
}
json_writer& json_writer::value(std::string_view s) {
  element();
  out_ += escape(s);
  return *this;
}
json_writer& json_writer::value(bool b) {
  element();
  out_ += b ? "true" : "false";
  return *this;
}
json_writer& json_writer::fields(const record& r) {
  for (const field& f : r) {
    key(f.name);
    std::visit([this](const auto& v) { value(v); }, f.value);
  }
  return *this;
}

// ---- files -----------------------------------------------------------------------------------

void write_file(const std::string& path, const std::string& text) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
  }
  std::ofstream f(path, std::ios::binary);
  if (!f) throw error("cannot open '" + path + "' for writing");
  f << text;
  f.close();
  if (!f) throw error("cannot write '" + path + "'");
}

namespace {
std::string csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}
std::string cell_text(const field& f) {
  if (const double* d = std::get_if<double>(&f.value)) {
    if (!std::isfinite(*d)) return "";
    return strf("%.6g", *d);
  }
  if (const std::uint64_t* u = std::get_if<std::uint64_t>(&f.value)) return std::to_string(*u);
  return std::get<std::string>(f.value);
}
}  // namespace

std::string to_csv(const std::vector<record>& rows) {
  std::string o;
  if (rows.empty()) return o;
  for (std::size_t i = 0; i < rows[0].size(); ++i) o += (i ? "," : "") + csv_cell(rows[0][i].name);
  o += "\n";
  for (const record& r : rows) {
    for (std::size_t i = 0; i < r.size(); ++i) o += (i ? "," : "") + csv_cell(cell_text(r[i]));
    o += "\n";
  }
  return o;
}

void finish_json(json_writer& j, const std::vector<record>& rows, const std::string& path) {
  j.key("rows").begin_array();
  for (const record& r : rows) j.begin_object(true).fields(r).end_object();
  j.end_array().end_object();
  write_file(path, j.str());
  std::printf("wrote %s\n", path.c_str());
}

void write_csv(const std::string& path, const std::vector<record>& rows) {
  write_file(path, to_csv(rows));
  std::printf("wrote %s\n", path.c_str());
}

// ---- text ------------------------------------------------------------------------------------

std::string strf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string s(n > 0 ? std::size_t(n) : 0, '\0');
  if (n > 0) std::vsnprintf(s.data(), s.size() + 1, fmt, ap2);
  va_end(ap2);
  return s;
}

text_table::text_table(std::vector<std::string> headers) {
  for (std::string& h : headers) {
    const bool left = !h.empty() && h[0] == '<';
    left_.push_back(left);
    headers_.push_back(left ? h.substr(1) : h);
  }
}

void text_table::add_row(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

void text_table::print(std::FILE* out) const {
  std::vector<std::size_t> w(headers_.size());
  for (std::size_t i = 0; i < w.size(); ++i) {
    w[i] = headers_[i].size();
    for (const auto& r : rows_) w[i] = std::max(w[i], r[i].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s;
    for (std::size_t i = 0; i < w.size(); ++i) {
      const std::string pad(w[i] - cells[i].size(), ' ');
      s += (i ? "  " : "") + (left_[i] ? cells[i] + pad : pad + cells[i]);
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    std::fprintf(out, "%s\n", s.c_str());
  };
  line(headers_);
  std::size_t total = 0;
  for (std::size_t x : w) total += x;
  std::fprintf(out, "%s\n", std::string(total + 2 * (w.size() - 1), '-').c_str());
  for (const auto& r : rows_) line(r);
  std::fflush(out);
}

// ---- plots -----------------------------------------------------------------------------------

bool gnuplot_on_path() {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) dir = ".";
    const std::string exe = dir + "/gnuplot";
    if (access(exe.c_str(), X_OK) == 0) return true;
  }
  return false;
}

namespace {
std::string gp_quote(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o + "\"";
}
std::string tic_label(double x) {
  const auto n = static_cast<unsigned long long>(std::llround(x));
  if (n >= (1ull << 20) && n % (1ull << 20) == 0) return std::to_string(n >> 20) + "M";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + "K";
  return std::to_string(n);
}
}  // namespace

namespace {
/// gnuplot_on_path(), saying on stderr what to install when it is false.
bool gnuplot_or_say_why() {
  if (gnuplot_on_path()) return true;
  std::fprintf(stderr,
               "--plot: gnuplot is not on PATH, no plots written (Debian: apt-get install "
               "gnuplot-nox)\n");
  return false;
}
}  // namespace

bool run_gnuplot(const std::string& script) {
  if (!gnuplot_or_say_why()) return false;
  std::FILE* gp = popen("gnuplot", "w");
  if (gp == nullptr) {
    std::fprintf(stderr, "--plot: cannot start gnuplot, no plots written\n");
    return false;
  }
  std::fwrite(script.data(), 1, script.size(), gp);
  const int status = pclose(gp);
  if (status != 0) std::fprintf(stderr, "--plot: gnuplot exited with status %d\n", status);
  return true;
}

std::vector<std::string> write_plots(const std::string& dir, const std::vector<plot_spec>& plots) {
  std::vector<std::string> written;
  if (plots.empty()) return written;
  if (!gnuplot_or_say_why()) return written;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw error("--plot: cannot create directory '" + dir + "': " + ec.message());

  std::string script = "set terminal pngcairo size 900,600 enhanced font 'sans,11'\n";
  for (const plot_spec& p : plots) {
    const std::string file = (std::filesystem::path(dir) / p.file).string();
    std::filesystem::remove(file, ec);
    script += "reset\nset output " + gp_quote(file) + "\n";
    script += "set title " + gp_quote(p.title) + " noenhanced\n";
    script += "set xlabel " + gp_quote(p.xlabel) + "\nset ylabel " + gp_quote(p.ylabel) + "\n";
    script += "set grid\nset key top left noenhanced\n";
    std::set<double> xs;
    for (const plot_series& s : p.series) xs.insert(s.x.begin(), s.x.end());
    if (p.log2_x) {
      script += "set logscale x 2\n";
      if (!xs.empty()) {
        script += "set xrange [" + strf("%g", *xs.begin() / 1.3) + ":" + strf("%g", *xs.rbegin() * 1.3) + "]\n";
        std::string tics;
        for (double x : xs) tics += (tics.empty() ? "" : ", ") + gp_quote(tic_label(x)) + strf(" %g", x);
        script += "set xtics (" + tics + ")\n";
      }
    }
    double ymax = 0.0;
    for (const plot_series& s : p.series)
      for (double y : s.y)
        if (std::isfinite(y)) ymax = std::max(ymax, y);
    if (p.y_from_zero && p.hline > ymax)  // keep the reference line in view
      script += strf("set yrange [0:%g]\n", p.hline * 1.15);
    else if (p.y_from_zero)
      script += "set yrange [0:*]\n";
    if (p.hline >= 0.0)
      script += strf("set arrow from graph 0, first %g to graph 1, first %g nohead dt 2 lc rgb 'gray40'\n",
                     p.hline, p.hline);
    std::string plot_cmd, data;
    for (const plot_series& s : p.series) {
      plot_cmd += (plot_cmd.empty() ? "plot " : ", ") + std::string("'-' using 1:2 with linespoints lw 2 pt 7 title ") +
                  gp_quote(s.title);
      for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
        if (std::isfinite(s.y[i])) data += strf("%.9g %.9g\n", s.x[i], s.y[i]);
      data += "e\n";
    }
    if (plot_cmd.empty()) continue;
    script += plot_cmd + "\n" + data;
    script += "unset output\n";
  }
  if (!run_gnuplot(script)) return written;
  for (const plot_spec& p : plots) {
    const std::string file = (std::filesystem::path(dir) / p.file).string();
    if (std::filesystem::exists(file, ec) && std::filesystem::file_size(file, ec) > 0)
      written.push_back(file);
    else
      std::fprintf(stderr, "--plot: gnuplot did not write %s\n", file.c_str());
  }
  return written;
}

}  // namespace certattn::bench
