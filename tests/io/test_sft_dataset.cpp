// SFT dataset building: prompt/response JSONL and JSON lists, plain-text windows, truncation and
// skip counts, max_samples, and every error case. Expected token sequences are written out by hand
// from the byte tokenizer (id = byte, 256 BOS, 257 EOS).
#include "io/sft_dataset.h"

#include <nlohmann/json.hpp>

#include <filesystem>

#include "tests/io/io_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

const io::ByteTokenizer kTok;

std::vector<int32_t> bytes(const std::string& s) {
  return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(s.data()),
                              reinterpret_cast<const unsigned char*>(s.data()) + s.size());
}

std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

io::SftDatasetOptions opts(int64_t max_len,
                           io::OverlongPolicy policy = io::OverlongPolicy::kTruncate) {
  io::SftDatasetOptions o;
  o.max_len = max_len;
  o.overlong = policy;
  return o;
}

}  // namespace

TEST_CASE("sft jsonl: BOS + prompt + response + EOS, prompt_len, counts") {
  test::TempDir dir;
  const std::string p = dir.write("d.jsonl",
                                  "{\"input\": \"ab\", \"output\": \"cd\", \"extra\": 1}\n"
                                  "\n"
                                  "{\"input\": \"\", \"output\": \"x\"}\n"
                                  "{\"input\": \"q\", \"output\": \"\"}\n");
  const auto ds = io::build_sft_dataset(p, kTok, opts(64));
  CHECK(ds.format == "jsonl");
  REQUIRE(ds.samples.size() == 3);
  CHECK(ds.samples[0].tokens == cat({{256}, bytes("abcd"), {257}}));
  CHECK(ds.samples[0].prompt_len == 3);
  CHECK(ds.samples[1].tokens == std::vector<int32_t>{256, 'x', 257});
  CHECK(ds.samples[1].prompt_len == 1);
  CHECK(ds.samples[2].tokens == std::vector<int32_t>{256, 'q', 257});
  CHECK(ds.samples[2].prompt_len == 2);
  CHECK(ds.stats.total == 3);
  CHECK(ds.stats.truncated == 0);
  CHECK(ds.stats.skipped == 0);
  CHECK(ds.stats.tokens == 6 + 3 + 3);
  CHECK(ds.stats.loss_tokens == 3 + 2 + 1);
  CHECK_FALSE(ds.stats.limited);
  CHECK(ds.stats.summary() ==
        "3 samples (0 truncated, 0 skipped of 3 read), 12 tokens, 6 loss tokens");
}

TEST_CASE("sft jsonl: overlong samples, truncate vs skip") {
  test::TempDir dir;
  // Lengths with max_len 8: 1+3+3+1 = 8 (fits exactly), 1+3+7+1 = 12 (truncate to 8, 4 response
  // tokens remain), 1+7+2+1 = 11 with prompt_len 8 (the response is cut entirely → skipped),
  // 1+1+1+1 = 4.
  const std::string p = dir.write("d.jsonl",
                                  "{\"input\": \"abc\", \"output\": \"def\"}\n"
                                  "{\"input\": \"abc\", \"output\": \"defghij\"}\n"
                                  "{\"input\": \"abcdefg\", \"output\": \"hi\"}\n"
                                  "{\"input\": \"a\", \"output\": \"b\"}\n");
  SUBCASE("truncate") {
    const auto ds = io::build_sft_dataset(p, kTok, opts(8));
    REQUIRE(ds.samples.size() == 3);
    CHECK(ds.samples[0].tokens == cat({{256}, bytes("abcdef"), {257}}));
    CHECK(ds.samples[1].tokens == cat({{256}, bytes("abcdefg")}));  // EOS cut off
    CHECK(ds.samples[1].prompt_len == 4);
    CHECK(ds.samples[2].tokens == std::vector<int32_t>{256, 'a', 'b', 257});
    CHECK(ds.stats.total == 4);
    CHECK(ds.stats.truncated == 1);
    CHECK(ds.stats.skipped == 1);
    CHECK(ds.stats.loss_tokens == 4 + 4 + 2);
  }
  SUBCASE("skip") {
    const auto ds = io::build_sft_dataset(p, kTok, opts(8, io::OverlongPolicy::kSkip));
    REQUIRE(ds.samples.size() == 2);
    CHECK(ds.samples[0].tokens.size() == 8);
    CHECK(ds.samples[1].tokens.size() == 4);
    CHECK(ds.stats.total == 4);
    CHECK(ds.stats.truncated == 0);
    CHECK(ds.stats.skipped == 2);
  }
  SUBCASE("every sample skipped is an error that says why") {
    std::string msg =
        test::error_of([&] { io::build_sft_dataset(p, kTok, opts(3, io::OverlongPolicy::kSkip)); });
    RLHF_CHECK_CONTAINS(msg, p + ": no usable SFT sample: all 4 were skipped (4 longer than "
                                 "--max_len 3 with --truncation skip, 0 whose prompt");
    RLHF_CHECK_CONTAINS(msg, "hint: raise --max_len");
    msg = test::error_of([&] { io::build_sft_dataset(p, kTok, opts(2)); });
    RLHF_CHECK_CONTAINS(msg,
                        "all 4 were skipped (0 longer than --max_len 2 with --truncation skip, "
                        "4 whose prompt alone fills --max_len)");
  }
  SUBCASE("policy names") {
    CHECK(io::overlong_policy_from_string("skip") == io::OverlongPolicy::kSkip);
    CHECK(io::overlong_policy_from_string("truncate") == io::OverlongPolicy::kTruncate);
    CHECK(std::string(io::to_string(io::OverlongPolicy::kSkip)) == "skip");
    RLHF_CHECK_CONTAINS(test::error_of([] { io::overlong_policy_from_string("cut"); }),
                        "unknown --truncation policy 'cut'");
  }
}

TEST_CASE("sft jsonl: keys, max_samples, JSON lists") {
  test::TempDir dir;
  std::string lines;
  for (int i = 0; i < 5; ++i) {
    nlohmann::json rec;
    rec["question"] = fmt::format("q{}", i);
    rec["answer"] = "a";
    lines += rec.dump();
    lines += '\n';
  }
  const std::string p = dir.write("gsm.jsonl", lines);
  auto o = opts(32);
  o.input_key = "question";
  o.output_key = "answer";
  auto ds = io::build_sft_dataset(p, kTok, o);
  CHECK(ds.samples.size() == 5);
  CHECK(ds.samples[4].tokens == std::vector<int32_t>{256, 'q', '4', 'a', 257});

  o.max_samples = 2;
  ds = io::build_sft_dataset(p, kTok, o);
  CHECK(ds.samples.size() == 2);
  CHECK(ds.stats.total == 2);
  CHECK(ds.stats.limited);
  o.max_samples = 5;
  ds = io::build_sft_dataset(p, kTok, o);
  CHECK(ds.samples.size() == 5);
  CHECK_FALSE(ds.stats.limited);
  // Reading stops at max_samples: a malformed line after it is never parsed.
  const std::string tail = dir.write("tail.jsonl", lines + "{oops\n");
  o.max_samples = 3;
  ds = io::build_sft_dataset(tail, kTok, o);
  CHECK(ds.samples.size() == 3);
  CHECK(ds.stats.limited);

  // A .json list (SVAMP style) and a .json file holding JSON lines.
  o.max_samples = -1;
  const std::string list = dir.write(
      "list.json",
      "[{\"question\": \"x\", \"answer\": \"y\"}, {\"question\": \"z\", \"answer\": \"w\"}]");
  ds = io::build_sft_dataset(list, kTok, o);
  CHECK(ds.format == "json");
  REQUIRE(ds.samples.size() == 2);
  CHECK(ds.samples[1].tokens == std::vector<int32_t>{256, 'z', 'w', 257});
  const std::string jl = dir.write("lines.json", lines);
  ds = io::build_sft_dataset(jl, kTok, o);
  CHECK(ds.format == "jsonl");
  CHECK(ds.samples.size() == 5);
  const std::string bad_list = dir.write("bad_list.json", "[{\"question\": \"x\"}]");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::build_sft_dataset(bad_list, kTok, o); }),
                      bad_list + ": record 1: missing key 'answer' (--output_key)");
}

TEST_CASE("sft jsonl: errors name the file, line and key") {
  test::TempDir dir;
  const auto o = opts(64);
  const std::string missing = dir.file("none.jsonl");
  CHECK(test::error_of([&] { io::build_sft_dataset(missing, kTok, o); }) ==
        "cannot open " + missing + ": no such file");

  const std::string bad =
      dir.write("bad.jsonl", "{\"input\": \"a\", \"output\": \"b\"}\n\n{\"input\": }\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::build_sft_dataset(bad, kTok, o); }),
                      bad + ":3: malformed JSON: ");

  const std::string nokey = dir.write("nokey.jsonl",
                                      "{\"input\": \"a\", \"output\": \"b\"}\n"
                                      "{\"prompt\": \"a\", \"output\": \"b\"}\n");
  std::string msg = test::error_of([&] { io::build_sft_dataset(nokey, kTok, o); });
  RLHF_CHECK_CONTAINS(msg, nokey + ":2: missing key 'input' (--input_key)");
  RLHF_CHECK_CONTAINS(msg, "hint: the record's keys are 'output', 'prompt'");

  const std::string nostr = dir.write("nostr.jsonl", "{\"input\": \"a\", \"output\": [\"b\"]}\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::build_sft_dataset(nostr, kTok, o); }),
                      nostr + ":1: key 'output' must be a string, got array");

  const std::string notobj = dir.write("notobj.jsonl", "\"text\"\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::build_sft_dataset(notobj, kTok, o); }),
                      notobj + ":1: expected a JSON object, got string");

  const std::string empty = dir.write("empty.jsonl", "\n\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::build_sft_dataset(empty, kTok, o); }),
                      empty + ": no SFT samples: the file holds no JSON records");

  const std::string gz = dir.write("d.jsonl.gz", "\x1f\x8b");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::build_sft_dataset(gz, kTok, o); }),
                      "compressed datasets are not supported");

  const std::string ok = dir.write("ok.jsonl", "{\"input\": \"a\", \"output\": \"b\"}\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::build_sft_dataset(ok, kTok, opts(1)); }),
                      "--max_len must be >= 2, got 1");
  auto o0 = o;
  o0.max_samples = 0;
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::build_sft_dataset(ok, kTok, o0); }),
                      "--max_samples must be >= 1 (or -1 for all), got 0");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::build_sft_dataset(dir.path().string(), kTok, o); }),
                      "is a directory");
}

TEST_CASE("sft text: documents split by blank lines, windows of max_len, loss everywhere") {
  test::TempDir dir;
  const std::string p = dir.write("t.txt", "Hello\r\nworld\n\n \n\nSecond doc\n\n");
  // Stream: BOS "Hello\nworld" EOS BOS "Second doc" EOS = 1+11+1 + 1+10+1 = 25 tokens.
  const auto stream = cat({{256}, bytes("Hello\nworld"), {257}, {256}, bytes("Second doc"), {257}});
  REQUIRE(stream.size() == 25);
  auto join = [](const io::SftDataset& ds) {
    std::vector<int32_t> out;
    for (const auto& s : ds.samples) {
      CHECK(s.prompt_len == 0);
      out.insert(out.end(), s.tokens.begin(), s.tokens.end());
    }
    return out;
  };
  SUBCASE("windows of 5 cover the stream exactly") {
    const auto ds = io::build_sft_dataset(p, kTok, opts(5));
    CHECK(ds.format == "text");
    REQUIRE(ds.samples.size() == 5);
    for (const auto& s : ds.samples) CHECK(s.tokens.size() == 5);
    CHECK(join(ds) == stream);
    CHECK(ds.stats.total == 5);
    CHECK(ds.stats.skipped == 0);
    CHECK(ds.stats.tokens == 25);
    CHECK(ds.stats.loss_tokens == 5 * 4);
  }
  SUBCASE("windows of 8: 8 + 8 + 8 and a 1-token remainder, which is skipped") {
    const auto ds = io::build_sft_dataset(p, kTok, opts(8));
    REQUIRE(ds.samples.size() == 3);
    CHECK(join(ds) == std::vector<int32_t>(stream.begin(), stream.begin() + 24));
    CHECK(ds.stats.total == 4);
    CHECK(ds.stats.skipped == 1);
    CHECK(ds.stats.truncated == 0);
  }
  SUBCASE("windows of 7: the last one is shorter (4 tokens)") {
    const auto ds = io::build_sft_dataset(p, kTok, opts(7));
    REQUIRE(ds.samples.size() == 4);
    CHECK(ds.samples[3].tokens.size() == 4);
    CHECK(join(ds) == stream);
  }
  SUBCASE("max_samples limits the windows") {
    auto o = opts(5);
    o.max_samples = 2;
    const auto ds = io::build_sft_dataset(p, kTok, o);
    REQUIRE(ds.samples.size() == 2);
    CHECK(join(ds) == std::vector<int32_t>(stream.begin(), stream.begin() + 10));
    CHECK(ds.stats.limited);
  }
  SUBCASE("any extension other than .json/.jsonl is text; one document without blank lines") {
    const std::string md = dir.write("notes.md", "a\nb");
    const auto ds = io::build_sft_dataset(md, kTok, opts(100));
    REQUIRE(ds.samples.size() == 1);
    CHECK(ds.samples[0].tokens == std::vector<int32_t>{256, 'a', '\n', 'b', 257});
  }
  SUBCASE("empty texts are errors") {
    const std::string e = dir.write("e.txt", "");
    RLHF_CHECK_CONTAINS(test::error_of([&] { io::build_sft_dataset(e, kTok, opts(8)); }),
                        e + ": no SFT samples: the text file is empty");
    const std::string w = dir.write("w.txt", "\n  \n\t\n");
    RLHF_CHECK_CONTAINS(test::error_of([&] { io::build_sft_dataset(w, kTok, opts(8)); }),
                        "the text file is empty");
  }
}

TEST_CASE("sft jsonl: real data (gsm8k test split)") {
  const std::string root = test::shared_data_dir();
  const std::string p = root + "/gsm8k/test.jsonl";
  if (root.empty() || !std::filesystem::exists(p)) {
    MESSAGE("skipped: " << p << " not found (set RLHF_SHARED_DATA)");
    return;
  }
  auto o = opts(4096);
  o.input_key = "question";
  o.output_key = "answer";
  const auto ds = io::build_sft_dataset(p, kTok, o);
  CHECK(ds.stats.total == 1319);  // README: test 1,319
  CHECK(ds.samples.size() == 1319);
  // Every sample decodes back to its question + answer.
  const auto first = nlohmann::json::parse(test::slurp(p).substr(0, test::slurp(p).find('\n')));
  CHECK(kTok.decode(ds.samples[0].tokens) ==
        first["question"].get<std::string>() + first["answer"].get<std::string>());
  CHECK(ds.samples[0].prompt_len ==
        1 + static_cast<int32_t>(first["question"].get<std::string>().size()));
  // With a short max_len every sample truncates, and those with long questions are skipped.
  o.max_len = 200;
  const auto cut = io::build_sft_dataset(p, kTok, o);
  CHECK(cut.stats.total == 1319);
  CHECK(cut.stats.skipped + static_cast<int64_t>(cut.samples.size()) == 1319);
  CHECK(cut.stats.truncated > 0);
  CHECK(cut.stats.skipped > 0);
  for (const auto& s : cut.samples) {
    CHECK(s.tokens.size() <= 200);
    CHECK(s.prompt_len < 200);
  }
  MESSAGE("gsm8k test, max_len 200: " << cut.stats.summary());
}
