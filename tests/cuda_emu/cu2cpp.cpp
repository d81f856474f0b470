// cu2cpp IN.cu OUT.cpp: rewrites the two CUDA constructs a host C++ compiler cannot parse, so the
// emulator can compile a .cu file unchanged (tests/cuda_emu/emu.h):
//   kernel<<<grid, block, smem, stream>>>(args)
//     -> ::rlhf::emu::make_launcher("kernel", kernel, grid, block, smem, stream)(args)
//   extern __shared__ [__align__(N)] T name[];
//     -> T* name = reinterpret_cast<T*>(::rlhf::emu::dynamic_shared());
// Comments and string literals are left alone; line breaks are kept and a #line directive points
// diagnostics at the original file. Exits 1 with a message on a construct it cannot rewrite.
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const std::string& file, const std::string& what) {
  std::cerr << "cu2cpp: " << file << ": " << what << "\n";
  std::exit(1);
}

// Marks every character that is code (not in a comment, string or character literal).
std::vector<bool> code_mask(const std::string& s) {
  std::vector<bool> code(s.size(), true);
  size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, 2, "//") == 0) {
      while (i < s.size() && s[i] != '\n') code[i++] = false;
    } else if (s.compare(i, 2, "/*") == 0) {
      const size_t end = s.find("*/", i + 2);
      const size_t stop = end == std::string::npos ? s.size() : end + 2;
      while (i < stop) code[i++] = false;
    } else if (s[i] == '"' || s[i] == '\'') {
      const char q = s[i];
      code[i++] = false;
      while (i < s.size() && s[i] != q) {
        if (s[i] == '\\') code[i++] = false;
        if (i < s.size()) code[i++] = false;
      }
      if (i < s.size()) code[i++] = false;
    } else {
      ++i;
    }
  }
  return code;
}

size_t find_code(const std::string& s, const std::vector<bool>& code, const std::string& pat,
                 size_t from) {
  for (size_t p = s.find(pat, from); p != std::string::npos; p = s.find(pat, p + 1))
    if (code[p]) return p;
  return std::string::npos;
}

bool ident_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
}

// Start of the kernel expression that ends just before `end` (identifier, `::` qualifiers and
// one balanced template argument list).
size_t kernel_start(const std::string& s, size_t end, const std::string& file) {
  size_t i = end;
  while (i > 0 && std::isspace(static_cast<unsigned char>(s[i - 1]))) --i;
  if (i > 0 && s[i - 1] == '>') {
    int depth = 0;
    while (i > 0) {
      const char c = s[--i];
      if (c == '>') ++depth;
      if (c == '<' && --depth == 0) break;
    }
    if (depth != 0) die(file, "unbalanced template arguments before <<<");
  }
  while (i > 0 && (ident_char(s[i - 1]) || s[i - 1] == ':')) --i;
  if (i == end) die(file, "no kernel name before <<<");
  return i;
}

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::string rewrite_launches(const std::string& s, const std::string& file) {
  const std::vector<bool> code = code_mask(s);
  std::string out;
  size_t done = 0;
  for (size_t open = find_code(s, code, "<<<", 0); open != std::string::npos;
       open = find_code(s, code, "<<<", done)) {
    const size_t close = find_code(s, code, ">>>", open + 3);
    if (close == std::string::npos) die(file, "<<< without >>>");
    const size_t start = kernel_start(s, open, file);
    if (start < done) die(file, "overlapping launches");
    const std::string kernel = trim(s.substr(start, open - start));
    out += s.substr(done, start - done);
    out += "::rlhf::emu::make_launcher(\"" + kernel + "\", " + kernel + ", ";
    out += s.substr(open + 3, close - open - 3);
    out += ")";
    done = close + 3;
  }
  return out + s.substr(done);
}

std::string rewrite_dynamic_shared(const std::string& s, const std::string& file) {
  const std::vector<bool> code = code_mask(s);
  std::string out;
  size_t done = 0;
  const std::string key = "extern __shared__";
  for (size_t p = find_code(s, code, key, 0); p != std::string::npos;
       p = find_code(s, code, key, done)) {
    const size_t semi = s.find(';', p);
    if (semi == std::string::npos) die(file, "extern __shared__ without ;");
    std::string decl = s.substr(p + key.size(), semi - p - key.size());
    const size_t align = decl.find("__align__");
    if (align != std::string::npos) {
      const size_t rp = decl.find(')', align);
      if (rp == std::string::npos) die(file, "bad __align__ in extern __shared__");
      decl.erase(align, rp + 1 - align);
    }
    decl = trim(decl);
    if (decl.size() < 3 || decl.compare(decl.size() - 2, 2, "[]") != 0)
      die(file, "extern __shared__ declaration is not `T name[]`");
    decl = trim(decl.substr(0, decl.size() - 2));
    size_t n = decl.size();
    while (n > 0 && ident_char(decl[n - 1])) --n;
    const std::string name = decl.substr(n), type = trim(decl.substr(0, n));
    if (name.empty() || type.empty()) die(file, "cannot parse extern __shared__ declaration");
    out += s.substr(done, p - done);
    out += type + "* " + name + " = reinterpret_cast<" + type + "*>(::rlhf::emu::dynamic_shared())";
    done = semi;  // keeps the ';'
  }
  return out + s.substr(done);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: cu2cpp IN.cu OUT.cpp\n";
    return 2;
  }
  const std::string in = argv[1];
  std::ifstream f(in, std::ios::binary);
  if (!f) die(in, "cannot read");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = rewrite_dynamic_shared(rewrite_launches(ss.str(), in), in);
  const std::string out_path = argv[2];
  const std::string tmp = out_path + ".tmp";
  {
    std::ofstream o(tmp, std::ios::binary);
    o << "#line 1 \"" << in << "\"\n" << text;
    if (!o) die(out_path, "cannot write");
  }
  if (std::rename(tmp.c_str(), out_path.c_str()) != 0) die(out_path, "cannot rename");
  return 0;
}
