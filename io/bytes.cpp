#include "io/bytes.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <limits>

namespace rlhf::io {

Blob map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  RLHF_CHECK(fd >= 0, "cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    RLHF_FAIL("cannot stat {}: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    RLHF_FAIL("cannot open {}: not a regular file", path);
  }
  Blob b;
  b.source = path;
  b.size = static_cast<size_t>(st.st_size);
  if (b.size == 0) {
    ::close(fd);
    return b;
  }
  void* p = ::mmap(nullptr, b.size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  RLHF_CHECK(p != MAP_FAILED, "cannot map {} ({} bytes): {}", path, b.size, std::strerror(err));
  const size_t n = b.size;
  b.owner =
      std::shared_ptr<const void>(p, [n](const void* q) { ::munmap(const_cast<void*>(q), n); });
  b.data = static_cast<const uint8_t*>(p);
  return b;
}

Blob blob_from_string(std::string bytes, std::string source) {
  auto s = std::make_shared<const std::string>(std::move(bytes));
  Blob b;
  b.data = reinterpret_cast<const uint8_t*>(s->data());
  b.size = s->size();
  b.owner = s;
  b.source = std::move(source);
  return b;
}

int64_t checked_mul(int64_t a, int64_t b, const std::string& source, const char* what) {
  RLHF_CHECK(a >= 0 && b >= 0, "{}: corrupt header: negative {} ({} x {})", source, what, a, b);
  int64_t r = 0;
  RLHF_CHECK(!__builtin_mul_overflow(a, b, &r), "{}: corrupt header: {} overflows ({} x {})",
             source, what, a, b);
  return r;
}

int64_t checked_add(int64_t a, int64_t b, const std::string& source, const char* what) {
  int64_t r = 0;
  RLHF_CHECK(!__builtin_add_overflow(a, b, &r), "{}: corrupt header: {} overflows ({} + {})",
             source, what, a, b);
  return r;
}

const uint8_t* ByteReader::take(uint64_t n, const char* what) {
  RLHF_CHECK(n <= remaining(),
             "{}: truncated or corrupt: {} at byte {} needs {} bytes, only {} remain", source_,
             what, pos_, n, remaining());
  const uint8_t* p = data_ + pos_;
  pos_ += static_cast<size_t>(n);
  return p;
}

void ByteReader::seek(uint64_t pos, const char* what) {
  RLHF_CHECK(pos <= size_, "{}: truncated or corrupt: {} at byte {} is past the end ({} bytes)",
             source_, what, pos, size_);
  pos_ = static_cast<size_t>(pos);
}

}  // namespace rlhf::io
