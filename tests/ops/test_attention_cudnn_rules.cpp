// The host-side rules of the cuDNN attention (model/ops/cuda/attention_cudnn_rules.h), on the CPU:
// validation errors, the head dims and lengths offered to cuDNN, the cuDNN versions accepted at
// run time. Whether cuDNN then serves a shape is for tests/ops/test_attention_cudnn_cuda.cpp on a
// GPU.
#include "model/ops/cuda/attention_cudnn_rules.h"

#include <string>

#include "tests/test_util.h"

using namespace rlhf;
namespace rules = rlhf::model::cudnn_attention;

TEST_CASE("cudnn attention rules: bad dimensions throw, naming the op and the values") {
  CHECK_NOTHROW(rules::check_problem("op", 1, 1, 1, 1, 1));
  CHECK_NOTHROW(rules::check_problem("op", 2, 1000, 32, 8, 64));
  for (int bad = 0; bad < 5; ++bad) {
    int64_t d[5] = {2, 100, 8, 2, 64};
    d[bad] = bad % 2 == 0 ? 0 : -3;
    CHECK_THROWS_AS(rules::check_problem("op", d[0], d[1], d[2], d[3], d[4]), rlhf::Error);
  }
  try {
    rules::check_problem("attention_backward_cudnn", 1, 9, 3, 2, 64);
    FAIL("H % Hkv != 0 was accepted");
  } catch (const rlhf::Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("attention_backward_cudnn") != std::string::npos);
    CHECK(msg.find("H=3") != std::string::npos);
    CHECK(msg.find("Hkv=2") != std::string::npos);
  }
  // B·T·H·D at 2^62 overflows the byte counts downstream.
  CHECK_THROWS_AS(rules::check_problem("op", int64_t{1} << 33, int64_t{1} << 16, 64, 8, 128),
                  rlhf::Error);
}

TEST_CASE("cudnn attention rules: head dims are multiples of 8 up to 128") {
  for (int64_t D = 1; D <= 256; ++D)
    CHECK_MESSAGE(rules::head_dim_supported(D) == (D % 8 == 0 && D <= 128), "D=" << D);
  CHECK_FALSE(rules::head_dim_supported(0));
  CHECK_FALSE(rules::head_dim_supported(-64));
}

TEST_CASE("cudnn attention rules: every length above 1 is offered, multiples of 128 or not") {
  for (int64_t T : {2, 7, 100, 127, 128, 129, 255, 1000, 1024, 4097})
    CHECK_MESSAGE(rules::problem_offered(3, T, 32, 8, 64), "T=" << T);
  CHECK_FALSE(rules::problem_offered(3, 1, 32, 8, 64));   // one position: the flash kernels
  CHECK_FALSE(rules::problem_offered(3, 100, 9, 2, 64));  // H % Hkv != 0
  CHECK_FALSE(rules::problem_offered(3, 100, 9, 3, 72 + 4));
  CHECK_FALSE(rules::problem_offered(0, 100, 9, 3, 64));
  CHECK(rules::problem_offered(1, 100, 9, 3, 64));  // SmolLM-135M heads (GQA 3:1)
  CHECK(rules::problem_offered(1, 67, 4, 1, 128));  // MQA, D = 128
}

TEST_CASE("cudnn attention rules: cuDNN 9 at run time, except 9.10.0 and 9.10.1") {
  CHECK(rules::runtime_version_supported(90000, 9));
  CHECK(rules::runtime_version_supported(91400, 9));  // the H200 machine's 9.14.0
  CHECK(rules::runtime_version_supported(91900, 9));  // the headers built against here
  CHECK(rules::runtime_version_supported(91002, 9));
  CHECK_FALSE(rules::runtime_version_supported(91000, 9));
  CHECK_FALSE(rules::runtime_version_supported(91001, 9));
  CHECK_FALSE(rules::runtime_version_supported(8907, 9));    // cuDNN 8.9.7
  CHECK_FALSE(rules::runtime_version_supported(100100, 9));  // a later major than compiled for
  CHECK_FALSE(rules::runtime_version_supported(91400, 10));
}
