#include "io/h5_check.h"

#include <fmt/format.h>

#include <vector>

namespace rlhf::io {

void h5_init() {
  // The HDF5 build is thread-safe, where the default error stack (and its auto-print setting) is
  // per thread: silence it once per thread.
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
}

namespace {

struct StackEntry {
  std::string func, desc, minor;
};

herr_t collect_entry(unsigned /*n*/, const H5E_error2_t* err, void* data) {
  auto* entries = static_cast<std::vector<StackEntry>*>(data);
  StackEntry e;
  e.func = err->func_name ? err->func_name : "?";
  e.desc = err->desc ? err->desc : "";
  char buf[256] = {0};
  H5E_type_t type;
  if (H5Eget_msg(err->min_num, &type, buf, sizeof(buf)) > 0) e.minor = buf;
  entries->push_back(std::move(e));
  return 0;
}

}  // namespace

std::string h5_error_stack() {
  // Copy the stack first and walk the copy: H5Eget_msg inside the walk is an API call that would
  // clear the default stack under our feet. H5Eget_current_stack also clears the default stack.
  hid_t stack = H5Eget_current_stack();
  if (stack < 0) return "";
  std::vector<StackEntry> entries;
  H5Ewalk2(stack, H5E_WALK_DOWNWARD, collect_entry, &entries);
  H5Eclose_stack(stack);
  // Outermost (the API call) and the two innermost entries (the cause) are what a reader needs;
  // deep stacks (a checksum failure is 14 levels down) elide the middle.
  std::string out;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries.size() > 3 && i > 0 && i + 2 < entries.size()) {
      if (i == 1) out += " <- ...";
      continue;
    }
    if (!out.empty()) out += " <- ";
    out += fmt::format("{}: {}", entries[i].func, entries[i].desc);
  }
  if (!entries.empty() && !entries.back().minor.empty())
    out += fmt::format(" ({})", entries.back().minor);
  // One line: HDF5 descriptions can carry newlines (e.g. a ctime() timestamp).
  std::string line;
  for (char c : out) {
    if (c == '\n' || c == '\r') c = ' ';
    if (c == ' ' && !line.empty() && line.back() == ' ') continue;
    line.push_back(c);
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

namespace detail {
std::string h5_error_text(int64_t result) {
  std::string stack = h5_error_stack();
  return stack.empty() ? fmt::format("returned {}", result)
                       : fmt::format("returned {}: {}", result, stack);
}
}  // namespace detail

void H5Id::reset() noexcept {
  if (id_ < 0) return;
  h5_init();
  switch (H5Iget_type(id_)) {
    case H5I_FILE:
      H5Fclose(id_);
      break;
    case H5I_GROUP:
      H5Gclose(id_);
      break;
    case H5I_DATASET:
      H5Dclose(id_);
      break;
    case H5I_DATASPACE:
      H5Sclose(id_);
      break;
    case H5I_DATATYPE:
      H5Tclose(id_);
      break;
    case H5I_ATTR:
      H5Aclose(id_);
      break;
    case H5I_GENPROP_LST:
      H5Pclose(id_);
      break;
    default:
      break;
  }
  H5Eclear2(H5E_DEFAULT);
  id_ = H5I_INVALID_HID;
}

void H5Id::close() {
  if (id_ < 0) return;
  hid_t id = std::exchange(id_, H5I_INVALID_HID);
  switch (H5_CHECK(H5Iget_type(id))) {
    case H5I_FILE:
      H5_CHECK(H5Fclose(id));
      break;
    case H5I_GROUP:
      H5_CHECK(H5Gclose(id));
      break;
    case H5I_DATASET:
      H5_CHECK(H5Dclose(id));
      break;
    case H5I_DATASPACE:
      H5_CHECK(H5Sclose(id));
      break;
    case H5I_DATATYPE:
      H5_CHECK(H5Tclose(id));
      break;
    case H5I_ATTR:
      H5_CHECK(H5Aclose(id));
      break;
    case H5I_GENPROP_LST:
      H5_CHECK(H5Pclose(id));
      break;
    default:
      RLHF_FAIL("internal error: H5Id::close on an identifier of unknown type");
  }
}

}  // namespace rlhf::io
