#include "io/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "io/file_util.h"

namespace rlhf::io {

namespace {

DType parse_dtype(const std::string& s, const std::string& where) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  RLHF_FAIL("{}: dtype {} is not supported\nhint: F32, F16 and BF16 tensors can be read", where, s);
}

}  // namespace

void SafetensorsFile::read_f32(const std::string& name, float* out) const {
  auto it = tensors.find(name);
  RLHF_CHECK(it != tensors.end(), "{}: no tensor '{}'", blob.source, name);
  const SafetensorsEntry& e = it->second;
  convert_to_f32(e.dtype, blob.data + data_offset + e.begin, out, e.numel);
}

SafetensorsFile parse_safetensors(Blob blob) {
  SafetensorsFile f;
  const std::string& src = blob.source;
  ByteReader r(blob);
  const uint64_t n = r.read<uint64_t>("header length");
  RLHF_CHECK(n <= static_cast<uint64_t>(kSafetensorsMaxHeaderBytes),
             "{}: not a safetensors file or corrupt: header length {} exceeds the {} byte limit",
             src, n, kSafetensorsMaxHeaderBytes);
  RLHF_CHECK(n <= r.remaining(),
             "{}: truncated or corrupt: the header claims {} bytes, the file has {} after the "
             "length field",
             src, n, r.remaining());
  const std::string text = r.read_string(n, "header");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    RLHF_FAIL("{}: corrupt safetensors header (not JSON): {}", src, e.what());
  }
  RLHF_CHECK(j.is_object(), "{}: corrupt safetensors header: not a JSON object", src);
  f.data_offset = static_cast<int64_t>(8 + n);
  const int64_t data_size = static_cast<int64_t>(blob.size) - f.data_offset;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      RLHF_CHECK(v.is_object() || v.is_null(), "{}: __metadata__ must be an object", src);
      if (v.is_object())
        for (auto m = v.begin(); m != v.end(); ++m)
          if (m.value().is_string()) f.metadata[m.key()] = m.value().get<std::string>();
      continue;
    }
    const std::string where = fmt::format("{}: tensor '{}'", src, name);
    RLHF_CHECK(
        v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
        "{}: corrupt entry (needs dtype, shape, data_offsets)", where);
    RLHF_CHECK(v["dtype"].is_string(), "{}: dtype is not a string", where);
    SafetensorsEntry e;
    e.dtype = parse_dtype(v["dtype"].get<std::string>(), where);
    RLHF_CHECK(v["shape"].is_array() && v["shape"].size() <= 8, "{}: corrupt shape {}", where,
               v["shape"].dump());
    for (const auto& d : v["shape"]) {
      RLHF_CHECK(d.is_number_unsigned(), "{}: corrupt shape {}", where, v["shape"].dump());
      const uint64_t dim = d.get<uint64_t>();
      RLHF_CHECK(dim <= (uint64_t{1} << 62), "{}: corrupt shape {}", where, v["shape"].dump());
      e.shape.push_back(static_cast<int64_t>(dim));
      e.numel = checked_mul(e.numel, e.shape.back(), where, "element count");
    }
    const auto& off = v["data_offsets"];
    RLHF_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                   off[1].is_number_unsigned(),
               "{}: corrupt data_offsets {}", where, off.dump());
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    RLHF_CHECK(b <= en && en <= static_cast<uint64_t>(std::max<int64_t>(data_size, 0)),
               "{}: truncated or corrupt: data_offsets [{}, {}] outside the {} data bytes of the "
               "file",
               where, b, en, data_size);
    e.begin = static_cast<int64_t>(b);
    e.end = static_cast<int64_t>(en);
    const int64_t want = dtype_bytes(e.dtype, e.numel, where);
    RLHF_CHECK(e.end - e.begin == want, "{}: corrupt: {} bytes for {} {} elements (expected {})",
               where, e.end - e.begin, e.numel, to_string(e.dtype), want);
    if (e.end > e.begin) ranges.emplace_back(e.begin, e.end);
    f.tensors.emplace(name, std::move(e));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    RLHF_CHECK(ranges[i].first >= ranges[i - 1].second,
               "{}: corrupt: tensor data ranges overlap at byte {}", src, ranges[i].first);
  f.blob = std::move(blob);
  return f;
}

SafetensorsFile open_safetensors(const std::string& path) {
  return parse_safetensors(map_file(path));
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteItem>& items,
                       DType dtype, const std::map<std::string, std::string>& metadata) {
  RLHF_CHECK(dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16,
             "{}: safetensors export supports F32, F16 and BF16, not {}", path, to_string(dtype));
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  int64_t offset = 0;
  std::vector<int64_t> numels;
  for (const auto& it : items) {
    int64_t n = 1;
    for (int64_t d : it.shape) n = checked_mul(n, d, path, "element count");
    numels.push_back(n);
    const int64_t bytes = dtype_bytes(dtype, n, path);
    header[it.name] = {{"dtype", to_string(dtype)},
                       {"shape", it.shape},
                       {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  AtomicFile out(path);
  const uint64_t n = text.size();
  out.write(&n, sizeof(n));
  out.write(text.data(), text.size());
  std::vector<float> buf;
  std::vector<uint8_t> conv;
  for (size_t i = 0; i < items.size(); ++i) {
    buf.assign(static_cast<size_t>(numels[i]), 0.0f);
    items[i].fill(buf.data());
    conv.resize(static_cast<size_t>(dtype_bytes(dtype, numels[i], path)));
    convert_from_f32(dtype, buf.data(), conv.data(), numels[i]);
    out.write(conv.data(), conv.size());
  }
  out.commit();
}

}  // namespace rlhf::io
