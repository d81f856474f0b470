// LoRA against PEFT: tests/fixtures/lora/*.h5 are written by scripts/make_lora_fixtures.py from
// PEFT's LoRA layers around transformers' Llama / Qwen2 in float64 (tests/fixtures/lora/README.md).
// The base is frozen in a weights-only store and the adapters train in parallel::LoraStore, as
// `rlhf sft/grpo --lora_rank` run them: adapted log-probs and loss, the gradients of A and B (the
// base gets none), the reference log-probs with the adapters off, the merged weights, 5 AdamW
// steps with clipping, and the PEFT adapter folders read and written.
#include <mpi.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>

#include "io/hdf5_ckpt.h"
#include "io/jsonl.h"
#include "io/peft_adapter.h"
#include "parallel/lora_store.h"
#include "parallel/zero3.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

// Tolerances as tests/test_fixtures.cpp (fp32 against a float64 reference, same model sizes).
constexpr double kGradRelTol = 1e-4;
constexpr double kLpAbsTol = 2e-5;

struct LoraFixture {
  std::string dir, name;
  std::unique_ptr<io::CheckpointReader> f;
  model::ModelConfig cfg;
  model::LoraConfig lora;
  std::vector<int32_t> ids, targets;
  int64_t B = 0, T = 0, count = 0;
};

LoraFixture open_lora_fixture(const std::string& name) {
  LoraFixture fx;
  fx.dir = std::string(RLHF_SOURCE_DIR) + "/tests/fixtures/lora/";
  fx.name = name;
  const std::string path = fx.dir + name + ".h5";
  REQUIRE(std::filesystem::exists(path));
  fx.f = std::make_unique<io::CheckpointReader>(path);
  auto j = nlohmann::json::parse(fx.f->read_string_attr("/", "config"));
  fx.cfg = model::ModelConfig::from_json(j, path);
  fx.lora.rank = int(fx.f->read_int_attr("/lora", "r"));
  fx.lora.alpha = fx.f->read_float_attr("/lora", "lora_alpha");
  fx.lora.targets = model::parse_target_modules(fx.f->read_string_attr("/lora", "target_modules"));
  std::vector<int64_t> shape;
  fx.ids = fx.f->read_dataset_vector<int32_t>("/input_ids", &shape);
  fx.B = shape.at(0);
  fx.T = shape.at(1);
  fx.targets = fx.f->read_dataset_vector<int32_t>("/targets");
  for (int32_t t : fx.targets) fx.count += t >= 0;
  return fx;
}

parallel::Comm& self_comm() {
  test::init_mpi();
  static std::unique_ptr<parallel::Comm> self = parallel::make_comm(MPI_COMM_SELF, "self");
  return *self;
}

// The trainer's LoRA model: the fixture's base in a frozen store, its adapter in a LoraStore.
std::unique_ptr<parallel::TrainModel> lora_model(const LoraFixture& fx,
                                                 const model::ParamLayout& layout) {
  parallel::Zero3Options o;
  o.frozen = true;
  auto base = std::make_unique<parallel::Zero3Store>(layout, self_comm(), o);
  for (int u = 0; u < layout.num_units(); ++u) {
    std::vector<float> full(size_t(layout.unit(u).numel), 0.0f);
    for (const auto& t : layout.unit(u).tensors)
      fx.f->read_dataset("/params/" + t.name, full.data() + t.offset, t.shape);
    base->load_unit(u, full.data());
  }
  auto ls = std::make_unique<parallel::LoraStore>(std::move(base), fx.lora, self_comm(), 1);
  const model::LoraLayout& ll = ls->lora_layout();
  std::vector<float> a(size_t(ll.numel()), 0.0f);
  for (const model::TensorInfo& t : ll.tensors())
    fx.f->read_dataset("/lora/adapter/" + t.name, a.data() + t.offset, t.shape);
  ls->load_adapters(a.data());
  return parallel::make_cpu_train_model(std::move(ls), false);
}

double lm_loss(const std::vector<float>& lp, const LoraFixture& fx) {
  double loss = 0;
  for (float v : lp) loss -= v;
  return loss / double(fx.count);
}

void check_lora_fixture(const std::string& name) {
  const LoraFixture fx = open_lora_fixture(name);
  const model::ParamLayout layout(fx.cfg, model::HeadKind::kLM);
  auto net = lora_model(fx, layout);
  auto& ls = dynamic_cast<parallel::LoraStore&>(net->store());
  const model::LoraLayout& ll = ls.lora_layout();
  const int64_t N = fx.B * fx.T;
  std::vector<float> lp(N), dlp(N);
  for (int64_t n = 0; n < N; ++n) dlp[n] = fx.targets[n] >= 0 ? -1.0f / float(fx.count) : 0.0f;

  SUBCASE("adapted log-probs, loss and the gradients of A and B; the base gets none") {
    ls.zero_grads();
    net->forward_lm(fx.ids.data(), fx.targets.data(), fx.B, fx.T, lp.data(), nullptr, true);
    auto cmp =
        test::compare_arrays(lp.data(), fx.f->read_dataset_vector<float>("/lora/lp").data(), N);
    INFO(cmp.summary(name + " lp"));
    CHECK(cmp.max_abs_err <= kLpAbsTol);
    CHECK(lm_loss(lp, fx) ==
          doctest::Approx(fx.f->read_float_attr("/lora/loss", "float64_value")).epsilon(1e-6));
    net->backward_lm(dlp.data(), nullptr);
    for (const model::TensorInfo& t : ll.tensors()) {
      auto ref = fx.f->read_dataset_vector<float>("/lora/grads/" + t.name);
      REQUIRE(int64_t(ref.size()) == t.numel);
      double gmax = 0;
      for (float v : ref) gmax = std::max(gmax, std::fabs(double(v)));
      auto c = test::compare_arrays(ls.adapter_grads() + t.offset, ref.data(), t.numel);
      INFO(c.summary(t.name) << " | max |g_ref| " << gmax);
      CHECK(gmax > 0);
      CHECK(c.max_abs_err <= kGradRelTol * gmax + 1e-9);
    }
    CHECK(ls.memory().grads_bytes == 2 * ll.numel() * int64_t(sizeof(float)));  // adapters only
  }

  SUBCASE("the reference policy: the adapters off give the base model's log-probs") {
    auto ref = parallel::adapters_off_view(*net);
    ref->forward_lm(fx.ids.data(), fx.targets.data(), fx.B, fx.T, lp.data(), nullptr, false);
    auto want = fx.f->read_dataset_vector<float>("/lora/ref_lp");
    auto cmp = test::compare_arrays(lp.data(), want.data(), N);
    INFO(cmp.summary(name + " ref_lp"));
    CHECK(cmp.max_abs_err <= kLpAbsTol);
    // And back on afterwards.
    std::vector<float> on(N);
    net->forward_lm(fx.ids.data(), fx.targets.data(), fx.B, fx.T, on.data(), nullptr, false);
    CHECK(test::compare_arrays(on.data(), fx.f->read_dataset_vector<float>("/lora/lp").data(), N)
              .max_abs_err <= kLpAbsTol);
  }

  SUBCASE("merged weights W + (alpha/r)·B·A = merge_and_unload()") {
    for (int l = 0; l < fx.cfg.num_hidden_layers; ++l) {
      const int u = layout.layer_unit(l);
      std::vector<float> w(size_t(layout.unit(u).numel));
      ls.gather_unit(u, w.data());
      for (const model::ProjInfo& p : model::kProjections) {
        if (ll.entry(l, p.id).a < 0) continue;
        const model::TensorInfo& t = layout.unit(u).at(p.weight_name);
        auto ref = fx.f->read_dataset_vector<float>("/lora/merged/" + t.name);
        auto c = test::compare_arrays(w.data() + t.offset, ref.data(), t.numel);
        INFO(c.summary(t.name));
        CHECK(c.max_abs_err <= 1e-6);
      }
    }
  }

  SUBCASE("5 AdamW steps with clipping on the adapters") {
    optim::AdamWConfig cfg;
    cfg.lr = 1e-2;
    cfg.beta1 = 0.9;
    cfg.beta2 = 0.95;
    cfg.eps = 1e-8;
    cfg.weight_decay = 0.1;
    auto losses_ref = fx.f->read_dataset_vector<float>("/lora/train/losses");
    auto norms_ref = fx.f->read_dataset_vector<float>("/lora/train/grad_norms");
    for (size_t step = 0; step < losses_ref.size(); ++step) {
      ls.zero_grads();
      net->forward_lm(fx.ids.data(), fx.targets.data(), fx.B, fx.T, lp.data(), nullptr, true);
      const double loss = lm_loss(lp, fx);
      net->backward_lm(dlp.data(), nullptr);
      const double norm = parallel::clip_and_step(ls, cfg, cfg.lr, int64_t(step) + 1, 1.0);
      INFO("step " << step << " loss " << loss << " ref " << losses_ref[step] << " norm " << norm
                   << " ref " << norms_ref[step]);
      CHECK(loss == doctest::Approx(losses_ref[step]).epsilon(2e-5));
      CHECK(norm == doctest::Approx(norms_ref[step]).epsilon(1e-4));
    }
    for (const model::TensorInfo& t : ll.tensors()) {
      auto ref = fx.f->read_dataset_vector<float>("/lora/train/final/" + t.name);
      auto c = test::compare_arrays(ls.adapters() + t.offset, ref.data(), t.numel);
      INFO(c.summary(name + " final " + t.name));
      CHECK(c.max_abs_err <= 1e-4);
    }
  }

  SUBCASE("PEFT adapter folders: PEFT's reads as the fixture; ours writes it back") {
    const std::string peft = fx.dir + name + "_peft";
    const model::LoraConfig pc = io::read_peft_adapter_config(peft);
    CHECK(pc.rank == fx.lora.rank);
    CHECK(pc.alpha == fx.lora.alpha);
    CHECK(pc.targets == fx.lora.targets);
    const std::vector<float> a = io::read_peft_adapter_weights(peft, ll);
    CHECK(std::equal(a.begin(), a.end(), ls.adapters()));  // float32 both ways: bit for bit
    const std::string out = (std::filesystem::temp_directory_path() /
                             ("rlhf_peft_" + name + std::to_string(::getpid())))
                                .string();
    io::write_peft_adapter(out, ll, a.data(), "base");
    const auto j = io::parse_json_file(out + "/adapter_config.json");
    CHECK(j.at("peft_type") == "LORA");
    CHECK(j.at("r") == fx.lora.rank);
    CHECK(io::read_peft_adapter_config(out).targets == fx.lora.targets);
    CHECK(io::read_peft_adapter_weights(out, ll) == a);
    // RLHF_KEEP_PEFT_EXPORT=1 keeps the folder, for scripts/check_peft_adapter.py (PEFT itself
    // loads it onto the fixture's base and must reproduce /lora/logits).
    if (std::getenv("RLHF_KEEP_PEFT_EXPORT") == nullptr)
      std::filesystem::remove_all(out);
    else
      MESSAGE("kept " << out);
    // A rank that does not match the model's adapter layout is refused, naming the tensor.
    model::LoraConfig other = fx.lora;
    other.rank += 1;
    const model::LoraLayout wrong(model::layer_spec(fx.cfg), int(fx.cfg.num_hidden_layers), other);
    CHECK_THROWS_WITH_AS(io::read_peft_adapter_weights(peft, wrong),
                         doctest::Contains("lora_A.weight has shape"), Error);
  }
}

}  // namespace

TEST_CASE("PEFT LoRA fixture: llama, all-linear, r 4") {
  check_lora_fixture("lora_llama");
}
TEST_CASE("PEFT LoRA fixture: qwen2 with q/k/v bias, q_proj,v_proj,down_proj, r 2") {
  check_lora_fixture("lora_qwen2");
}

// A sequence-classification model (reward model, PPO critic) under LoRA, against PEFT's SEQ_CLS
// task (scripts/make_lora_seqcls_fixtures.py): the trunk's adapters plus the score head, which
// trains fully as PEFT's modules_to_save (its copy lives among the adapters; the base's stays).
TEST_CASE("PEFT LoRA fixture: llama sequence classifier, the score head in modules_to_save") {
  const std::string dir = std::string(RLHF_SOURCE_DIR) + "/tests/fixtures/lora/";
  const std::string path = dir + "lora_llama_seqcls.h5";
  REQUIRE(std::filesystem::exists(path));
  io::CheckpointReader f(path);
  const model::ModelConfig cfg =
      model::ModelConfig::from_json(nlohmann::json::parse(f.read_string_attr("/", "config")), path);
  model::LoraConfig lc;
  lc.rank = int(f.read_int_attr("/lora", "r"));
  lc.alpha = f.read_float_attr("/lora", "lora_alpha");
  lc.targets = model::parse_target_modules(f.read_string_attr("/lora", "target_modules"));
  lc.save_score = true;
  std::vector<int64_t> shape;
  const std::vector<int32_t> ids = f.read_dataset_vector<int32_t>("/input_ids", &shape);
  const int64_t B = shape.at(0), T = shape.at(1), N = B * T;
  const std::vector<float> value_r = f.read_dataset_vector<float>("/value_r");

  const model::ParamLayout layout(cfg, model::HeadKind::kReward);
  parallel::Zero3Options o;
  o.frozen = true;
  auto base = std::make_unique<parallel::Zero3Store>(layout, self_comm(), o);
  auto ls_own = std::make_unique<parallel::LoraStore>(std::move(base), lc, self_comm(), 1);
  parallel::LoraStore* lsp = ls_own.get();
  for (int u = 0; u < layout.num_units(); ++u) {
    std::vector<float> full(size_t(layout.unit(u).numel), 0.0f);
    for (const auto& t : layout.unit(u).tensors)
      f.read_dataset("/params/" + t.name, full.data() + t.offset, t.shape);
    lsp->load_unit(u, full.data());  // the head unit also starts the score head's trained copy
  }
  const model::LoraLayout& ll = lsp->lora_layout();
  REQUIRE(ll.score_offset() >= 0);
  lsp->init_adapters(5);  // PEFT's fresh adapters: the score copy is left as loaded
  {
    const auto want = f.read_dataset_vector<float>("/params/score.weight");
    CHECK(std::equal(want.begin(), want.end(), lsp->adapters() + ll.score_offset()));
  }
  std::vector<float> a(lsp->adapters(), lsp->adapters() + ll.numel());
  for (const model::TensorInfo& t : ll.tensors())
    if (t.name != "score.weight")
      f.read_dataset("/lora/adapter/" + t.name, a.data() + t.offset, t.shape);
  lsp->load_adapters(a.data());
  auto net = parallel::make_cpu_train_model(std::move(ls_own), false);
  parallel::LoraStore& ls = *lsp;
  std::vector<float> values(N), dv(N);
  for (int64_t n = 0; n < N; ++n) dv[n] = value_r[n] / float(N);
  auto loss_of = [&](const std::vector<float>& v) {
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += double(v[n]) * double(value_r[n]);
    return s / double(N);
  };

  SUBCASE("values and the gradients of A, B and the score head") {
    ls.zero_grads();
    net->forward_scalar(ids.data(), B, T, values.data(), true);
    auto cmp =
        test::compare_arrays(values.data(), f.read_dataset_vector<float>("/lora/values").data(), N);
    INFO(cmp.summary("seqcls values"));
    CHECK(cmp.max_abs_err <= kLpAbsTol);
    CHECK(loss_of(values) ==
          doctest::Approx(f.read_float_attr("/lora/loss", "float64_value")).epsilon(1e-5));
    net->backward_scalar(dv.data());
    int checked = 0;
    for (const model::TensorInfo& t : ll.tensors()) {
      auto ref = f.read_dataset_vector<float>("/lora/grads/" + t.name);
      REQUIRE(int64_t(ref.size()) == t.numel);
      double gmax = 0;
      for (float v : ref) gmax = std::max(gmax, std::fabs(double(v)));
      auto c = test::compare_arrays(ls.adapter_grads() + t.offset, ref.data(), t.numel);
      INFO(c.summary(t.name) << " | max |g_ref| " << gmax);
      CHECK(gmax > 0);
      CHECK(c.max_abs_err <= kGradRelTol * gmax + 1e-9);
      ++checked;
    }
    CHECK(checked == int(ll.tensors().size()));
    CHECK(ll.tensors().back().name == "score.weight");
  }

  SUBCASE("adapters off: the base model's values (base score head)") {
    auto ref = parallel::adapters_off_view(*net);
    ref->forward_scalar(ids.data(), B, T, values.data(), false);
    auto cmp =
        test::compare_arrays(values.data(), f.read_dataset_vector<float>("/values").data(), N);
    INFO(cmp.summary("seqcls base values"));
    CHECK(cmp.max_abs_err <= kLpAbsTol);
  }

  SUBCASE("5 AdamW steps on the adapters and the score head; the merged model has it") {
    optim::AdamWConfig oc;
    oc.lr = 1e-2;
    oc.beta1 = 0.9;
    oc.beta2 = 0.95;
    oc.eps = 1e-8;
    oc.weight_decay = 0.1;
    auto losses_ref = f.read_dataset_vector<float>("/lora/train/losses");
    for (size_t step = 0; step < losses_ref.size(); ++step) {
      ls.zero_grads();
      net->forward_scalar(ids.data(), B, T, values.data(), true);
      net->backward_scalar(dv.data());
      parallel::clip_and_step(ls, oc, oc.lr, int64_t(step) + 1, 1.0);
      INFO("step " << step);
      CHECK(loss_of(values) == doctest::Approx(losses_ref[step]).epsilon(2e-5));
    }
    for (const model::TensorInfo& t : ll.tensors()) {
      auto ref = f.read_dataset_vector<float>("/lora/train/final/" + t.name);
      auto c = test::compare_arrays(ls.adapters() + t.offset, ref.data(), t.numel);
      INFO(c.summary("final " + t.name));
      CHECK(c.max_abs_err <= 1e-4);
    }
    // The saved (merged) model carries the trained score head; the frozen base's is unchanged.
    const int hu = layout.head_unit();
    std::vector<float> w(size_t(layout.unit(hu).numel));
    ls.gather_unit(hu, w.data());
    const model::TensorInfo& st = layout.unit(hu).at("score.weight");
    CHECK(std::equal(w.begin() + st.offset, w.begin() + st.offset + st.numel,
                     ls.adapters() + ll.score_offset()));
    auto ref = parallel::adapters_off_view(*net);
    ref->forward_scalar(ids.data(), B, T, values.data(), false);
    CHECK(test::compare_arrays(values.data(), f.read_dataset_vector<float>("/values").data(), N)
              .max_abs_err <= kLpAbsTol);
  }

  SUBCASE("PEFT SEQ_CLS folders: PEFT's reads as the fixture; ours writes it back") {
    const std::string peft = dir + "lora_llama_seqcls_peft";
    const model::LoraConfig pc = io::read_peft_adapter_config(peft);
    CHECK(pc.save_score);
    CHECK(pc.targets == lc.targets);
    const std::vector<float> r = io::read_peft_adapter_weights(peft, ll);
    CHECK(std::equal(r.begin(), r.end(), ls.adapters()));
    const std::string out =
        (std::filesystem::temp_directory_path() / ("rlhf_peft_seqcls" + std::to_string(::getpid())))
            .string();
    io::write_peft_adapter(out, ll, r.data(), "base");
    const auto j = io::parse_json_file(out + "/adapter_config.json");
    CHECK(j.at("task_type") == "SEQ_CLS");
    CHECK(j.at("modules_to_save") == nlohmann::json{"classifier", "score"});
    CHECK(io::read_peft_adapter_weights(out, ll) == r);
    // RLHF_KEEP_PEFT_EXPORT=1 keeps the folder for `scripts/make_lora_seqcls_fixtures.py
    // --check-adapter DIR` (PEFT loads it onto the fixture's base: /lora/values again).
    if (std::getenv("RLHF_KEEP_PEFT_EXPORT") == nullptr)
      std::filesystem::remove_all(out);
    else
      MESSAGE("kept " << out);
    // An LM adapter layout has no score head: the file's is refused, naming it.
    model::LoraConfig lm = lc;
    lm.save_score = false;
    const model::LoraLayout lml(model::layer_spec(cfg), int(cfg.num_hidden_layers), lm);
    CHECK_THROWS_WITH_AS(io::read_peft_adapter_weights(peft, lml),
                         doctest::Contains("base_model.model.score.weight"), Error);
  }
}
