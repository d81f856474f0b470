// Internal to the engine (rollout/engine.cpp, rollout/engine_run.cpp): a sample being generated,
// and the bookkeeping of one generate() call — how a sampled token ends a sample or a turn, the
// turn hooks' answers, and the results.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "rollout/engine.h"

namespace rlhf::rollout {

/// One sample being generated.
struct Engine::Seq {
  int64_t request_index = 0;
  uint64_t request_id = 0;
  int64_t sample_index = 0;
  const SamplingParams* sampling = nullptr;
  std::vector<int32_t> blocks;  // its KV blocks (worst case, allocated at admission)
  int64_t len = 0;              // positions in the cache
  int32_t next_token = -1;      // last sampled token: fed at position len by the next step
  /// Observation tokens fed after next_token (positions len+1, ...): one decode row each, all in
  /// the next step, or one per step on a backend that takes one row per sequence. Empty in
  /// single-turn generation.
  std::vector<int32_t> extra;
  /// Row by row: how many of next_token, extra... earlier steps fed (0 = next_token comes next).
  int64_t fed = 0;
  int64_t max_new = 0;
  int64_t turn = 0;        // index of the current turn
  int64_t turn_begin = 0;  // response position where the current turn began
  bool eos = false;        // the turn that ended last ended with EOS
  GenerationResult result;
  /// While kept between generate() calls (Engine::kept_): its prompt, which with result.tokens
  /// identifies the continuation that may resume it.
  std::vector<int32_t> prompt;

  /// Binds it to request r (position `index` in this call, capped max_new) as its sample
  /// `sample`: the request fields, and a fresh result that opens with r's prefix (its log-probs
  /// as given, else zeros). Blocks, len and next_token are the caller's.
  void open(const GenerationRequest& r, int64_t index, int64_t sample, int64_t max_new_tokens);

  /// Whether it samples a token at this decode step: fed row by row (by_row), a sequence still
  /// feeding its observation samples nothing.
  bool samples_now(bool by_row) const {
    return !by_row || fed == static_cast<int64_t>(extra.size());
  }
  /// The uniform draw of its next token: its random stream (seed, request id, sample index) at
  /// the index of that token in the response.
  double next_draw() const {
    return counter_uniform(sampling->seed, request_id, uint64_t(sample_index),
                           uint64_t(result.tokens.size()));
  }
};

/// Per request of a validated generate() call (Engine::validate).
struct Engine::Plan {
  std::vector<int64_t> max_new;     ///< max_new_tokens capped under max_position_embeddings
  std::vector<int64_t> blocks_per;  ///< KV blocks one sample can ever need
  int64_t samples_total = 0;
};

/// The bookkeeping of one generate() call: the requests waiting for admission, the sequences
/// decoding, with hooks those whose turn ended in the current step, the results by (request,
/// sample) and the samples finished so far.
struct Engine::Run {
  /// What a sampled token did to its sample.
  enum class Outcome { kGoing, kFinished, kTurnEnd };
  /// A request whose samples (all, or the rest) wait for admission.
  struct Pending {
    int64_t index, next_sample, remaining;
  };

  /// Every request pending, in order.
  Run(const std::vector<GenerationRequest>& requests, Plan plan, KvCache& cache, EngineStats& stats,
      const TurnHooks* hooks, int32_t eos, bool ignore_eos, int64_t vocab_size);
  /// Returns the KV blocks of every sequence still active or turning (an exception mid-way), so
  /// the engine stays usable for the next call.
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  /// Whether anything is left to do: requests waiting, sequences decoding or turning.
  bool busy() const { return !pending.empty() || !active.empty() || !turning.empty(); }

  /// Appends a sampled token to s. kFinished: s is done (its blocks released, its result
  /// stored); kTurnEnd: its turn ended (hooks with on_turn_end; the caller parks it in
  /// `turning`); kGoing: it continues with the token as next_token.
  Outcome append(Seq& s, const SampledToken& t);
  /// Ends s with reason r: releases its blocks and stores its result.
  void finish(Seq& s, FinishReason r);
  /// Stores `result` as s's (its request and sample) and counts s finished.
  void record(const Seq& s, GenerationResult&& result);
  /// Asks the hooks about every sample in `turning` (one on_turn_end call), then finishes each or
  /// appends its observation and moves it to `active`. `turning` is empty afterwards.
  void resolve_turns(std::vector<std::unique_ptr<Seq>>& turning,
                     std::vector<std::unique_ptr<Seq>>& active);
  /// The results in (request_index, sample_index) order.
  std::vector<GenerationResult> take_results();
  /// Generation quota (Engine::generate's quota_groups): whether that many group keys have
  /// every sample finished.
  bool quota_reached(const std::vector<GenerationRequest>& requests, int64_t quota_groups) const;
  /// Ends generation at the quota: every active sequence and every sample never admitted
  /// returns interrupted with its tokens so far. keep (EngineOptions::keep_interrupted_kv): the
  /// active sequences move there with their KV blocks (prompt set) instead of releasing them.
  void interrupt_all(const std::vector<GenerationRequest>& requests,
                     std::vector<std::unique_ptr<Seq>>* keep);

  Plan plan;
  std::deque<Pending> pending;
  std::vector<std::unique_ptr<Seq>> active;   // decoding
  std::vector<std::unique_ptr<Seq>> turning;  // their turn ended this step (multi-turn)
  bool waiting = false;  // the front request waits for a slot or KV blocks (counted once)
  int64_t samples_done = 0;

 private:
  KvCache& cache_;
  EngineStats& stats_;
  const TurnHooks* hooks_;
  int32_t eos_;
  bool ignore_eos_;
  int64_t vocab_size_;
  std::vector<std::vector<GenerationResult>> results_;
  std::vector<int64_t> first_;     // per request: GenerationRequest::first_sample_index
  std::vector<int64_t> finished_;  // per request: samples finished
};

}  // namespace rlhf::rollout
