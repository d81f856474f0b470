#include "io/hdf5_ckpt.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/checked_alloc.h"
#include "io/h5_check.h"

namespace rlhf::io {

namespace fs = std::filesystem;

namespace {

// --- element types ---------------------------------------------------------------------------

template <typename T>
struct H5Traits;
template <>
struct H5Traits<float> {
  static hid_t file() { return H5T_IEEE_F32LE; }
  static hid_t mem() { return H5T_NATIVE_FLOAT; }
};
template <>
struct H5Traits<double> {
  static hid_t file() { return H5T_IEEE_F64LE; }
  static hid_t mem() { return H5T_NATIVE_DOUBLE; }
};
template <>
struct H5Traits<int32_t> {
  static hid_t file() { return H5T_STD_I32LE; }
  static hid_t mem() { return H5T_NATIVE_INT32; }
};
template <>
struct H5Traits<int64_t> {
  static hid_t file() { return H5T_STD_I64LE; }
  static hid_t mem() { return H5T_NATIVE_INT64; }
};
template <>
struct H5Traits<uint8_t> {
  static hid_t file() { return H5T_STD_U8LE; }
  static hid_t mem() { return H5T_NATIVE_UINT8; }
};
template <>
struct H5Traits<uint64_t> {
  static hid_t file() { return H5T_STD_U64LE; }
  static hid_t mem() { return H5T_NATIVE_UINT64; }
};

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  if constexpr (std::is_same_v<T, double>) return "float64";
  if constexpr (std::is_same_v<T, int32_t>) return "int32";
  if constexpr (std::is_same_v<T, int64_t>) return "int64";
  if constexpr (std::is_same_v<T, uint8_t>) return "uint8";
  if constexpr (std::is_same_v<T, uint64_t>) return "uint64";
  return "?";
}

// "float32", "int64", "uint8", "string", ... for a stored HDF5 type.
std::string describe_type(hid_t type) {
  const H5T_class_t cls = H5_CHECK(H5Tget_class(type));
  const size_t bits = H5Tget_size(type) * 8;
  switch (cls) {
    case H5T_FLOAT:
      return fmt::format("float{}", bits);
    case H5T_INTEGER:
      return fmt::format("{}int{}", H5_CHECK(H5Tget_sign(type)) == H5T_SGN_NONE ? "u" : "", bits);
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    default:
      return fmt::format("HDF5 type class {}", static_cast<int>(cls));
  }
}

// True if a stored value of `type` converts to T without loss.
template <typename T>
bool lossless(hid_t type) {
  const H5T_class_t cls = H5_CHECK(H5Tget_class(type));
  const size_t size = H5Tget_size(type);
  if constexpr (std::is_floating_point_v<T>) {
    return cls == H5T_FLOAT && size <= sizeof(T);
  } else {
    if (cls != H5T_INTEGER) return false;
    const bool stored_signed = H5_CHECK(H5Tget_sign(type)) != H5T_SGN_NONE;
    if (stored_signed == std::is_signed_v<T>) return size <= sizeof(T);
    return !stored_signed && size < sizeof(T);  // unsigned into a wider signed
  }
}

// --- paths -----------------------------------------------------------------------------------

// "model/a.b" or "/model/a.b/" → {"model", "a.b"}; "/" → {}.
std::vector<std::string> split_path(const std::string& path) {
  RLHF_CHECK(!path.empty(), "empty HDF5 object path\nhint: use \"/\" for the root group");
  std::vector<std::string> parts;
  size_t i = 0;
  if (path[0] == '/') i = 1;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    std::string part = path.substr(i, j - i);
    const bool trailing = j == path.size() - 1;
    if (part.empty() && trailing) break;
    RLHF_CHECK(!part.empty() && part != "." && part != "..",
               "invalid HDF5 object path '{}': empty, '.' or '..' component", path);
    parts.push_back(std::move(part));
    i = j + 1;
  }
  return parts;
}

std::string join_path(const std::vector<std::string>& parts, size_t n) {
  if (n == 0) return "/";
  std::string out;
  for (size_t k = 0; k < n; ++k) out += "/" + parts[k];
  return out;
}

std::string norm_path(const std::string& path) {
  auto parts = split_path(path);
  return join_path(parts, parts.size());
}

enum class ObjType { kMissing, kGroup, kDataset, kOther };

// What `path` names in `file`; every intermediate component must be a group (else an error).
ObjType object_type(hid_t file, const std::string& path) {
  const auto parts = split_path(path);
  for (size_t n = 1; n <= parts.size(); ++n) {
    const std::string prefix = join_path(parts, n);
    if (H5_CHECK(H5Lexists(file, prefix.c_str(), H5P_DEFAULT)) == 0) return ObjType::kMissing;
    H5O_info_t info;
    H5_CHECK(H5Oget_info_by_name2(file, prefix.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT));
    if (n < parts.size()) {
      RLHF_CHECK(info.type == H5O_TYPE_GROUP, "'{}' (in path '{}') is not a group", prefix, path);
      continue;
    }
    if (info.type == H5O_TYPE_GROUP) return ObjType::kGroup;
    if (info.type == H5O_TYPE_DATASET) return ObjType::kDataset;
    return ObjType::kOther;
  }
  return ObjType::kGroup;  // the root
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Elements of `shape`; throws rlhf::Error naming `what` (file and dataset) when a dimension is
// negative or the product overflows int64 (a corrupt file's dataspace can claim 2^64 - 1).
int64_t numel_of(const std::vector<int64_t>& shape, const std::string& what) {
  int64_t n = 1;
  for (int64_t d : shape) {
    RLHF_CHECK(d >= 0, "{}: negative dimension in shape {}", what, shape_str(shape));
    RLHF_CHECK(d == 0 || n <= std::numeric_limits<int64_t>::max() / d,
               "{}: shape {} has more elements than int64 can count (corrupt file?)", what,
               shape_str(shape));
    n *= d;
  }
  return n;
}

// Re-raises an HDF5 library failure (H5_CHECK) with the file and the operation in front; other
// rlhf::Errors (already user-facing) pass through unchanged.
template <typename F>
auto with_context(const std::string& file, const std::string& what, const char* hint, F&& f)
    -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.rfind("HDF5 error", 0) != 0) throw;
    throw Error(fmt::format("{}: {}: {}{}", file, what, msg, hint), e.where());
  }
}

constexpr const char* kCorruptHint =
    "\nhint: the file may be truncated or corrupt (an interrupted copy?); use another checkpoint";

// File access: the HDF5 1.10 format (checksummed metadata), close everything on H5Fclose, and no
// file locking (we never read a file while it is written: writes go to .tmp and are renamed;
// locking fails on some parallel file systems).
H5Id make_fapl() {
  H5Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  H5_CHECK(H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110));
  H5_CHECK(H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG));
  H5_CHECK(H5Pset_file_locking(fapl, false, true));
  return fapl;
}

H5Id make_lcpl() {
  H5Id lcpl(H5_CHECK(H5Pcreate(H5P_LINK_CREATE)));
  H5_CHECK(H5Pset_create_intermediate_group(lcpl, 1));
  H5_CHECK(H5Pset_char_encoding(lcpl, H5T_CSET_UTF8));
  return lcpl;
}

// Chunk shape of at most about kChunkElems elements: shrink the leading dimensions first, into
// equal parts (HDF5 stores the edge chunk whole: 2048 rows cut as 1365 + 683 would store 2730).
constexpr int64_t kChunkElems = int64_t{1} << 20;
std::vector<hsize_t> chunk_shape(const std::vector<int64_t>& shape) {
  std::vector<hsize_t> chunk(shape.begin(), shape.end());
  for (size_t i = 0; i < chunk.size(); ++i) {
    hsize_t total = 1;
    for (hsize_t c : chunk) total *= c;
    if (static_cast<int64_t>(total) <= kChunkElems) break;
    hsize_t rest = 1;
    for (size_t k = i + 1; k < chunk.size(); ++k) rest *= chunk[k];
    const hsize_t most = std::max<hsize_t>(1, static_cast<hsize_t>(kChunkElems) / rest);
    const hsize_t parts = (chunk[i] + most - 1) / most;
    chunk[i] = (chunk[i] + parts - 1) / parts;
  }
  return chunk;
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) {
    RLHF_CHECK(directory, "cannot open {} to sync it: {}", path, std::strerror(errno));
    return;
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems refuse fsync on directories: that only weakens durability, not atomicity.
  RLHF_CHECK(rc == 0 || directory, "cannot sync {} to disk: {}", path, std::strerror(err));
}

}  // namespace

// --- CheckpointWriter --------------------------------------------------------------------------

CheckpointWriter::CheckpointWriter(std::string path)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp") {
  RLHF_CHECK(!path_.empty(), "empty checkpoint path");
  const fs::path parent = fs::path(path_).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    RLHF_CHECK(!ec, "cannot create directory {} for checkpoint {}: {}", parent.string(), path_,
               ec.message());
  }
  with_context(tmp_path_, "cannot create checkpoint file", "", [&] {
    H5Id fapl = make_fapl();
    file_ = H5_CHECK(H5Fcreate(tmp_path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
  });
  try {
    write_string_attr("/", "format", kCheckpointFormat);
    write_int_attr("/", "format_version", kCheckpointFormatVersion);
  } catch (...) {
    H5Id(static_cast<hid_t>(file_)).reset();
    file_ = -1;
    std::error_code ec;
    fs::remove(tmp_path_, ec);
    throw;
  }
}

CheckpointWriter::~CheckpointWriter() {
  if (committed_) return;
  if (file_ >= 0) H5Id(static_cast<hid_t>(file_)).reset();
  file_ = -1;
  std::error_code ec;
  fs::remove(tmp_path_, ec);
}

void CheckpointWriter::check_open(const char* what) const {
  RLHF_CHECK(!committed_, "{}: cannot {} after commit()", path_, what);
  RLHF_CHECK(file_ >= 0, "{}: cannot {}: the file is closed after an earlier failure", path_, what);
}

void CheckpointWriter::create_group(const std::string& group) {
  check_open("create a group");
  const std::string g = norm_path(group);
  with_context(tmp_path_, fmt::format("cannot create group {}", g), "", [&] {
    const ObjType t = object_type(file_, g);
    if (t == ObjType::kGroup) return;
    RLHF_CHECK(t == ObjType::kMissing, "{}: cannot create group {}: a dataset of that name exists",
               tmp_path_, g);
    H5Id lcpl = make_lcpl();
    H5Id(H5_CHECK(H5Gcreate2(file_, g.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT))).close();
  });
}

template <typename T>
void CheckpointWriter::write_dataset(const std::string& dataset, const T* data,
                                     const std::vector<int64_t>& shape) {
  check_open("write a dataset");
  const std::string d = norm_path(dataset);
  RLHF_CHECK(d != "/", "{}: the root cannot be a dataset", tmp_path_);
  const int64_t n = numel_of(shape, fmt::format("{}: dataset {}", tmp_path_, d));
  RLHF_CHECK(data != nullptr || n == 0, "{}: dataset {}: null data for {} elements", tmp_path_, d,
             n);
  with_context(tmp_path_, fmt::format("cannot write dataset {}", d), "", [&] {
    RLHF_CHECK(object_type(file_, d) == ObjType::kMissing, "{}: dataset {} is written twice",
               tmp_path_, d);
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    H5Id space(shape.empty() ? H5_CHECK(H5Screate(H5S_SCALAR))
                             : H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(),
                                                         nullptr)));
    H5Id dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
    if (!shape.empty() && n > 0) {
      const std::vector<hsize_t> chunk = chunk_shape(shape);
      H5_CHECK(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()));
      H5_CHECK(H5Pset_fletcher32(dcpl));
    }
    H5Id lcpl = make_lcpl();
    H5Id ds(H5_CHECK(
        H5Dcreate2(file_, d.c_str(), H5Traits<T>::file(), space, lcpl, dcpl, H5P_DEFAULT)));
    if (n > 0) H5_CHECK(H5Dwrite(ds, H5Traits<T>::mem(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
    ds.close();
  });
}

void CheckpointWriter::write_attr_raw(const std::string& object, const std::string& name,
                                      int64_t file_type, int64_t mem_type, const void* value) {
  check_open("write an attribute");
  const std::string o = norm_path(object);
  RLHF_CHECK(!name.empty(), "{}: empty attribute name on {}", tmp_path_, o);
  with_context(tmp_path_, fmt::format("cannot write attribute '{}' on {}", name, o), "", [&] {
    if (object_type(file_, o) == ObjType::kMissing) create_group(o);
    if (H5_CHECK(H5Aexists_by_name(file_, o.c_str(), name.c_str(), H5P_DEFAULT)) > 0)
      H5_CHECK(H5Adelete_by_name(file_, o.c_str(), name.c_str(), H5P_DEFAULT));
    H5Id space(H5_CHECK(H5Screate(H5S_SCALAR)));
    H5Id attr(H5_CHECK(H5Acreate_by_name(file_, o.c_str(), name.c_str(), file_type, space,
                                         H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
    H5_CHECK(H5Awrite(attr, mem_type, value));
    attr.close();
  });
}

void CheckpointWriter::write_string_attr(const std::string& object, const std::string& name,
                                         const std::string& value) {
  // Fixed-length, null-padded UTF-8: stored inside the (checksummed) object header, unlike
  // variable-length strings, whose bytes live in an unchecksummed global heap.
  check_open("write an attribute");
  H5Id type(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_size(type, std::max<size_t>(1, value.size())));
  H5_CHECK(H5Tset_strpad(type, H5T_STR_NULLPAD));
  H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  std::string buf = value.empty() ? std::string(1, '\0') : value;
  write_attr_raw(object, name, type.get(), type.get(), buf.data());
}

void CheckpointWriter::write_int_attr(const std::string& object, const std::string& name,
                                      int64_t value) {
  write_attr_raw(object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void CheckpointWriter::write_float_attr(const std::string& object, const std::string& name,
                                        double value) {
  write_attr_raw(object, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

void CheckpointWriter::write_attrs(const std::string& object, const nlohmann::json& attrs) {
  RLHF_CHECK(attrs.is_object(), "{}: attributes for {} must be a JSON object, got {}", path_,
             object, attrs.type_name());
  for (auto it = attrs.begin(); it != attrs.end(); ++it) {
    const nlohmann::json& v = it.value();
    if (v.is_string())
      write_string_attr(object, it.key(), v.get<std::string>());
    else if (v.is_boolean())
      write_int_attr(object, it.key(), v.get<bool>() ? 1 : 0);
    else if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
      write_float_attr(object, it.key(), v.get<double>());
    else if (v.is_number_integer())
      write_int_attr(object, it.key(), v.get<int64_t>());
    else if (v.is_number_float())
      write_float_attr(object, it.key(), v.get<double>());
    else
      write_string_attr(object, it.key(), v.dump());
  }
}

void CheckpointWriter::commit() {
  check_open("commit");
  with_context(tmp_path_, "cannot flush and close", "", [&] {
    H5_CHECK(H5Fflush(file_, H5F_SCOPE_GLOBAL));
    const hid_t f = file_;
    file_ = -1;
    H5Id(f).close();
  });
  fsync_path(tmp_path_, false);
  std::error_code ec;
  fs::rename(tmp_path_, path_, ec);
  RLHF_CHECK(!ec, "cannot rename {} to {}: {}", tmp_path_, path_, ec.message());
  committed_ = true;
  const fs::path parent = fs::path(path_).parent_path();
  fsync_path(parent.empty() ? "." : parent.string(), true);
}

template void CheckpointWriter::write_dataset<float>(const std::string&, const float*,
                                                     const std::vector<int64_t>&);
template void CheckpointWriter::write_dataset<double>(const std::string&, const double*,
                                                      const std::vector<int64_t>&);
template void CheckpointWriter::write_dataset<int32_t>(const std::string&, const int32_t*,
                                                       const std::vector<int64_t>&);
template void CheckpointWriter::write_dataset<int64_t>(const std::string&, const int64_t*,
                                                       const std::vector<int64_t>&);
template void CheckpointWriter::write_dataset<uint8_t>(const std::string&, const uint8_t*,
                                                       const std::vector<int64_t>&);
template void CheckpointWriter::write_dataset<uint64_t>(const std::string&, const uint64_t*,
                                                        const std::vector<int64_t>&);

// --- CheckpointReader --------------------------------------------------------------------------

CheckpointReader::CheckpointReader(std::string path) : path_(std::move(path)) {
  std::error_code ec;
  const auto st = fs::status(path_, ec);
  RLHF_CHECK(fs::exists(st), "cannot open checkpoint {}: no such file", path_);
  RLHF_CHECK(!fs::is_directory(st), "cannot open checkpoint {}: it is a directory", path_);
  with_context(path_, "cannot open checkpoint", kCorruptHint, [&] {
    H5Id fapl = make_fapl();
    file_ = H5_CHECK(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl));
  });
}

CheckpointReader::~CheckpointReader() {
  if (file_ >= 0) H5Id(static_cast<hid_t>(file_)).reset();
}

bool CheckpointReader::exists(const std::string& object) const {
  const std::string o = norm_path(object);
  return with_context(path_, fmt::format("cannot look up {}", o), kCorruptHint,
                      [&] { return object_type(file_, o) != ObjType::kMissing; });
}

namespace {

struct ListCtx {
  std::vector<std::string> names;
  H5O_type_t want;
};

herr_t list_cb(hid_t group, const char* name, const H5L_info_t* /*info*/, void* data) {
  auto* ctx = static_cast<ListCtx*>(data);
  H5O_info_t oinfo;
  if (H5Oget_info_by_name2(group, name, &oinfo, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return -1;
  if (oinfo.type == ctx->want) ctx->names.emplace_back(name);
  return 0;
}

std::vector<std::string> list_children(hid_t file, const std::string& file_path,
                                       const std::string& group, H5O_type_t want) {
  const std::string g = norm_path(group);
  return with_context(file_path, fmt::format("cannot list group {}", g), kCorruptHint, [&] {
    const ObjType t = object_type(file, g);
    RLHF_CHECK(t != ObjType::kMissing, "{}: group {} not found", file_path, g);
    RLHF_CHECK(t == ObjType::kGroup, "{}: {} is not a group", file_path, g);
    H5Id gid(H5_CHECK(H5Gopen2(file, g.c_str(), H5P_DEFAULT)));
    ListCtx ctx{{}, want};
    // Native order, sorted below: an ordered iteration over dense link storage first builds a
    // table of the link count the file claims, and HDF5 1.10 frees its unfilled entries when a
    // corrupt file has fewer links than that (a crash in H5G__link_release_table; fuzz_hdf5_ckpt).
    H5_CHECK(H5Literate(gid, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, list_cb, &ctx));
    std::sort(ctx.names.begin(), ctx.names.end());
    return ctx.names;
  });
}

}  // namespace

std::vector<std::string> CheckpointReader::list_datasets(const std::string& group) const {
  return list_children(file_, path_, group, H5O_TYPE_DATASET);
}

std::vector<std::string> CheckpointReader::list_groups(const std::string& group) const {
  return list_children(file_, path_, group, H5O_TYPE_GROUP);
}

namespace {

// Opens dataset `d` (normalised) with a clear error when it is missing or not a dataset.
H5Id open_dataset(hid_t file, const std::string& file_path, const std::string& d) {
  const ObjType t = object_type(file, d);
  RLHF_CHECK(t != ObjType::kMissing, "{}: dataset {} not found", file_path, d);
  RLHF_CHECK(t == ObjType::kDataset, "{}: {} is not a dataset", file_path, d);
  return H5Id(H5_CHECK(H5Dopen2(file, d.c_str(), H5P_DEFAULT)));
}

// `what` ("<file>: dataset <d>") names the dataset in the errors.
std::vector<int64_t> dataset_shape(hid_t ds, const std::string& what) {
  H5Id space(H5_CHECK(H5Dget_space(ds)));
  const int rank = H5_CHECK(H5Sget_simple_extent_ndims(space));
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) H5_CHECK(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
  std::vector<int64_t> shape;
  for (hsize_t x : dims) {
    RLHF_CHECK(x <= static_cast<hsize_t>(std::numeric_limits<int64_t>::max()),
               "{}: dimension {} out of range (corrupt file?)", what, x);
    shape.push_back(static_cast<int64_t>(x));
  }
  numel_of(shape, what);  // the element count must fit in int64 too
  return shape;
}

}  // namespace

std::vector<int64_t> CheckpointReader::shape(const std::string& dataset) const {
  const std::string d = norm_path(dataset);
  return with_context(path_, fmt::format("cannot read the shape of {}", d), kCorruptHint, [&] {
    H5Id ds = open_dataset(file_, path_, d);
    return dataset_shape(ds, fmt::format("{}: dataset {}", path_, d));
  });
}

template <typename T>
void CheckpointReader::read_dataset(const std::string& dataset, T* out,
                                    const std::vector<int64_t>& expected_shape) const {
  const std::string d = norm_path(dataset);
  with_context(path_, fmt::format("cannot read dataset {}", d), kCorruptHint, [&] {
    H5Id ds = open_dataset(file_, path_, d);
    const std::vector<int64_t> actual = dataset_shape(ds, fmt::format("{}: dataset {}", path_, d));
    RLHF_CHECK(actual == expected_shape, "{}: dataset {} has shape {}, expected {}", path_, d,
               shape_str(actual), shape_str(expected_shape));
    H5Id type(H5_CHECK(H5Dget_type(ds)));
    RLHF_CHECK(lossless<T>(type), "{}: dataset {} holds {}, which does not convert to {} exactly",
               path_, d, describe_type(type), type_name<T>());
    const int64_t n = numel_of(actual, fmt::format("{}: dataset {}", path_, d));
    if (n == 0) return;
    RLHF_CHECK(out != nullptr, "{}: dataset {}: null output buffer", path_, d);
    H5_CHECK(H5Dread(ds, H5Traits<T>::mem(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out));
  });
}

void CheckpointReader::read_float_range(const std::string& dataset, int64_t begin, int64_t count,
                                        float* out) const {
  const std::string d = norm_path(dataset);
  with_context(path_, fmt::format("cannot read elements of dataset {}", d), kCorruptHint, [&] {
    H5Id ds = open_dataset(file_, path_, d);
    const std::vector<int64_t> s = dataset_shape(ds, fmt::format("{}: dataset {}", path_, d));
    RLHF_CHECK(s.size() == 1, "{}: dataset {} has shape {}, expected one dimension", path_, d,
               shape_str(s));
    RLHF_CHECK(begin >= 0 && count >= 0 && begin + count <= s[0],
               "{}: elements [{}, {}) of dataset {} requested, it has {}", path_, begin,
               begin + count, d, s[0]);
    H5Id type(H5_CHECK(H5Dget_type(ds)));
    RLHF_CHECK(lossless<float>(type),
               "{}: dataset {} holds {}, which does not convert to {} exactly", path_, d,
               describe_type(type), type_name<float>());
    if (count == 0) return;
    RLHF_CHECK(out != nullptr, "{}: dataset {}: null output buffer", path_, d);
    H5Id file_space(H5_CHECK(H5Dget_space(ds)));
    const hsize_t start = hsize_t(begin), n = hsize_t(count);
    H5_CHECK(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, &start, nullptr, &n, nullptr));
    H5Id mem_space(H5_CHECK(H5Screate_simple(1, &n, nullptr)));
    H5_CHECK(H5Dread(ds, H5T_NATIVE_FLOAT, mem_space, file_space, H5P_DEFAULT, out));
  });
}

template <typename T>
std::vector<T> CheckpointReader::read_dataset_vector(const std::string& dataset,
                                                     std::vector<int64_t>* shape_out) const {
  const std::vector<int64_t> s = shape(dataset);
  const std::string what = fmt::format("{}: dataset {}", path_, norm_path(dataset));
  std::vector<T> out;
  checked_resize(out, numel_of(s, what),
                 fmt::format("dataset {} of {}", norm_path(dataset), path_));
  read_dataset<T>(dataset, out.data(), s);
  if (shape_out) *shape_out = s;
  return out;
}

#define RLHF_INSTANTIATE_READ(T)                                                       \
  template void CheckpointReader::read_dataset<T>(const std::string&, T*,              \
                                                  const std::vector<int64_t>&) const;  \
  template std::vector<T> CheckpointReader::read_dataset_vector<T>(const std::string&, \
                                                                   std::vector<int64_t>*) const;
RLHF_INSTANTIATE_READ(float)
RLHF_INSTANTIATE_READ(double)
RLHF_INSTANTIATE_READ(int32_t)
RLHF_INSTANTIATE_READ(int64_t)
RLHF_INSTANTIATE_READ(uint8_t)
RLHF_INSTANTIATE_READ(uint64_t)
#undef RLHF_INSTANTIATE_READ

bool CheckpointReader::has_attr(const std::string& object, const std::string& name) const {
  const std::string o = norm_path(object);
  return with_context(
      path_, fmt::format("cannot look up attribute '{}' on {}", name, o), kCorruptHint, [&] {
        const ObjType t = object_type(file_, o);
        if (t == ObjType::kMissing) return false;
        return H5_CHECK(H5Aexists_by_name(file_, o.c_str(), name.c_str(), H5P_DEFAULT)) > 0;
      });
}

namespace {
herr_t attr_name_cb(hid_t /*loc*/, const char* name, const H5A_info_t* /*info*/, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> CheckpointReader::attr_names(const std::string& object) const {
  const std::string o = norm_path(object);
  return with_context(path_, fmt::format("cannot list the attributes of {}", o), kCorruptHint, [&] {
    RLHF_CHECK(object_type(file_, o) != ObjType::kMissing, "{}: object {} not found", path_, o);
    H5Id obj(H5_CHECK(H5Oopen(file_, o.c_str(), H5P_DEFAULT)));
    std::vector<std::string> names;
    // Native order, sorted below (ordered iteration builds a table first: see list_children).
    H5_CHECK(H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, attr_name_cb, &names));
    std::sort(names.begin(), names.end());
    return names;
  });
}

namespace {

// Opens attribute `name` of `o` after checking it exists and is a scalar.
H5Id open_scalar_attr(hid_t file, const std::string& file_path, const std::string& o,
                      const std::string& name) {
  RLHF_CHECK(object_type(file, o) != ObjType::kMissing, "{}: object {} not found", file_path, o);
  RLHF_CHECK(H5_CHECK(H5Aexists_by_name(file, o.c_str(), name.c_str(), H5P_DEFAULT)) > 0,
             "{}: attribute '{}' not found on {}", file_path, name, o);
  H5Id attr(H5_CHECK(H5Aopen_by_name(file, o.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT)));
  H5Id space(H5_CHECK(H5Aget_space(attr)));
  RLHF_CHECK(H5_CHECK(H5Sget_simple_extent_npoints(space)) == 1,
             "{}: attribute '{}' on {} is not a scalar", file_path, name, o);
  return attr;
}

std::string read_string(const H5Id& attr) {
  H5Id type(H5_CHECK(H5Aget_type(attr)));
  if (H5_CHECK(H5Tis_variable_str(type)) > 0) {
    H5Id mem(H5_CHECK(H5Tcopy(H5T_C_S1)));
    H5_CHECK(H5Tset_size(mem, H5T_VARIABLE));
    H5_CHECK(H5Tset_cset(mem, H5Tget_cset(type)));
    char* p = nullptr;
    H5_CHECK(H5Aread(attr, mem, &p));
    std::string s = p ? p : "";
    if (p) H5free_memory(p);
    return s;
  }
  const size_t size = H5Tget_size(type);
  RLHF_CHECK(size > 0 && size < (size_t{1} << 30), "string attribute of invalid size {}", size);
  std::string s(size, '\0');
  H5_CHECK(H5Aread(attr, type, s.data()));
  if (H5_CHECK(H5Tget_strpad(type)) == H5T_STR_SPACEPAD) {
    s.erase(s.find_last_not_of(' ') + 1);
  } else {
    const size_t nul = s.find('\0');
    if (nul != std::string::npos) s.resize(nul);
  }
  return s;
}

}  // namespace

std::string CheckpointReader::read_string_attr(const std::string& object,
                                               const std::string& name) const {
  const std::string o = norm_path(object);
  return with_context(path_, fmt::format("cannot read attribute '{}' on {}", name, o), kCorruptHint,
                      [&] {
                        H5Id attr = open_scalar_attr(file_, path_, o, name);
                        H5Id type(H5_CHECK(H5Aget_type(attr)));
                        RLHF_CHECK(H5_CHECK(H5Tget_class(type)) == H5T_STRING,
                                   "{}: attribute '{}' on {} is {}, not a string", path_, name, o,
                                   describe_type(type));
                        return read_string(attr);
                      });
}

int64_t CheckpointReader::read_int_attr(const std::string& object, const std::string& name) const {
  const std::string o = norm_path(object);
  return with_context(
      path_, fmt::format("cannot read attribute '{}' on {}", name, o), kCorruptHint, [&] {
        H5Id attr = open_scalar_attr(file_, path_, o, name);
        H5Id type(H5_CHECK(H5Aget_type(attr)));
        RLHF_CHECK(lossless<int64_t>(type), "{}: attribute '{}' on {} is {}, not an integer", path_,
                   name, o, describe_type(type));
        int64_t v = 0;
        H5_CHECK(H5Aread(attr, H5T_NATIVE_INT64, &v));
        return v;
      });
}

double CheckpointReader::read_float_attr(const std::string& object, const std::string& name) const {
  const std::string o = norm_path(object);
  return with_context(path_, fmt::format("cannot read attribute '{}' on {}", name, o), kCorruptHint,
                      [&] {
                        H5Id attr = open_scalar_attr(file_, path_, o, name);
                        H5Id type(H5_CHECK(H5Aget_type(attr)));
                        const H5T_class_t cls = H5_CHECK(H5Tget_class(type));
                        RLHF_CHECK(cls == H5T_FLOAT || cls == H5T_INTEGER,
                                   "{}: attribute '{}' on {} is {}, not a number", path_, name, o,
                                   describe_type(type));
                        double v = 0;
                        H5_CHECK(H5Aread(attr, H5T_NATIVE_DOUBLE, &v));
                        return v;
                      });
}

nlohmann::json CheckpointReader::read_attrs(const std::string& object) const {
  const std::string o = norm_path(object);
  nlohmann::json out = nlohmann::json::object();
  for (const std::string& name : attr_names(o)) {
    const auto kind = with_context(path_, fmt::format("cannot read attribute '{}' on {}", name, o),
                                   kCorruptHint, [&] {
                                     H5Id attr = open_scalar_attr(file_, path_, o, name);
                                     H5Id type(H5_CHECK(H5Aget_type(attr)));
                                     return H5_CHECK(H5Tget_class(type));
                                   });
    if (kind == H5T_STRING)
      out[name] = read_string_attr(o, name);
    else if (kind == H5T_INTEGER)
      out[name] = read_int_attr(o, name);
    else if (kind == H5T_FLOAT)
      out[name] = read_float_attr(o, name);
  }
  return out;
}

void check_checkpoint_format(const CheckpointReader& r) {
  RLHF_CHECK(r.has_attr("/", "format"),
             "{} is not an rlhf checkpoint (no 'format' attribute on the root group)\nhint: "
             "convert Hugging Face weights with `rlhf import`",
             r.path());
  const std::string format = r.read_string_attr("/", "format");
  RLHF_CHECK(format == kCheckpointFormat, "{}: format '{}' is not '{}'", r.path(), format,
             kCheckpointFormat);
  const int64_t version = r.read_int_attr("/", "format_version");
  RLHF_CHECK(version >= 1 && version <= kCheckpointFormatVersion,
             "{}: format_version {} is not supported by this build (it reads 1..{})\nhint: a "
             "newer rlhf wrote it; use that version",
             r.path(), version, kCheckpointFormatVersion);
}

}  // namespace rlhf::io
