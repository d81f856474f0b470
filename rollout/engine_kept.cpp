// Samples kept between generate() calls (EngineOptions::keep_interrupted_kv): a sample a quota
// interrupted holds its KV blocks until a later call continues it from them, asks for it anew,
// or needs its blocks.
#include <algorithm>

#include "core/error.h"
#include "rollout/engine_run.h"

namespace rlhf::rollout {

int64_t Engine::release_kept() {
  KvCache& kv = backend_->kv_cache();
  const int64_t n = kept_sequences();
  for (auto& s : kept_) kv.release(s->blocks);
  kept_.clear();
  return n;
}

int64_t Engine::evict_kept(int64_t blocks) {
  KvCache& kv = backend_->kv_cache();
  int64_t freed = 0, n = 0;
  while (freed < blocks && n < kept_sequences()) {
    freed += int64_t(kept_[size_t(n)]->blocks.size());
    kv.release(kept_[size_t(n)]->blocks);
    ++n;
  }
  kept_.erase(kept_.begin(), kept_.begin() + n);
  stats_.kept_evicted += n;
  return freed;
}

void Engine::resume_kept(const std::vector<GenerationRequest>& requests, Run& run) {
  if (kept_.empty()) return;
  KvCache& kv = backend_->kv_cache();
  std::vector<bool> resumed(requests.size(), false);
  // Whether request r continues kept sample s: the same random stream (id, sample index) and
  // the same tokens so far (the prompt, and the response as the prefix).
  const auto continues = [](const GenerationRequest& r, const Seq& s) {
    return r.n_samples == 1 && !r.prefix.empty() && r.id == s.request_id &&
           r.first_sample_index == s.sample_index && r.prompt == s.prompt &&
           r.prefix == s.result.tokens;
  };
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& r = requests[i];
    if (int64_t(run.active.size()) >= opt_.max_batch) break;
    const auto it = std::find_if(kept_.begin(), kept_.end(),
                                 [&](const std::unique_ptr<Seq>& s) { return continues(r, *s); });
    if (it == kept_.end()) continue;
    std::unique_ptr<Seq> s = std::move(*it);
    kept_.erase(it);
    // Its blocks were sized for the call that admitted it; a larger worst case takes more.
    const int64_t need = run.plan.blocks_per[i] - int64_t(s->blocks.size());
    if (need > 0 && !kv.allocate(need, s->blocks)) {
      kv.release(s->blocks);  // no room: prefilled again like any continuation
      continue;
    }
    const int64_t P = int64_t(r.prompt.size()), K = int64_t(r.prefix.size());
    RLHF_ASSERT(s->len == P + K - 1 && s->next_token == r.prefix.back());
    s->open(r, int64_t(i), s->sample_index, run.plan.max_new[i]);
    s->prompt.clear();
    ++stats_.resumed;
    stats_.resumed_positions += s->len;
    run.active.push_back(std::move(s));
    resumed[i] = true;
  }
  // A request for a kept sample's (id, sample index, prompt) that did not continue it (other
  // tokens, a fresh start, no room) supersedes its blocks; the rest stay for a later call.
  const auto asks_for = [](const GenerationRequest& r, const Seq& s) {
    return r.id == s.request_id && s.sample_index >= r.first_sample_index &&
           s.sample_index < r.first_sample_index + r.n_samples && r.prompt == s.prompt;
  };
  std::erase_if(kept_, [&](const std::unique_ptr<Seq>& s) {
    const bool asked = std::any_of(requests.begin(), requests.end(),
                                   [&](const GenerationRequest& r) { return asks_for(r, *s); });
    if (asked) {
      kv.release(s->blocks);
      ++stats_.kept_evicted;
    }
    return asked;
  });
  std::erase_if(run.pending, [&](const Run::Pending& p) { return resumed[size_t(p.index)]; });
}

}  // namespace rlhf::rollout
