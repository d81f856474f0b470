#include "model/activations.h"

#include "model/mlp.h"

namespace rlhf::model {

std::vector<ActInfo> layer_act_table(const LayerSpec& s, const ActOptions& o) {
  const int64_t C = s.C, Q = s.q_dim(), KV = s.kv_dim();
  std::vector<ActInfo> t;
  auto add = [&](Act id, const char* name, int64_t per_row, bool stat) {
    t.push_back({id, name, per_row, stat, id});
  };
  add(Act::kLn1, "ln1", C, false);
  add(Act::kRstd1, "rstd1", 1, true);
  add(Act::kQ, "q", Q, false);
  add(Act::kK, "k", KV, false);
  add(Act::kV, "v", KV, false);
  add(Act::kAtty, "atty", Q, false);
  add(Act::kXMid, "x_mid", C, false);
  if (o.share_norms) {
    t.push_back({Act::kLn2, "ln2", C, false, Act::kLn1});
    t.push_back({Act::kRstd2, "rstd2", 1, true, Act::kRstd1});
  } else {
    add(Act::kLn2, "ln2", C, false);
    add(Act::kRstd2, "rstd2", 1, true);
  }
  if (o.att_per_row > 0) add(Act::kAtt, "att", o.att_per_row, true);
  mlp_act_rows(t, s);
  if (s.qk_norm) {
    if (o.backward) {
      add(Act::kQRaw, "q_raw", Q, false);
      add(Act::kKRaw, "k_raw", KV, false);
    }
    add(Act::kQRstd, "q_rstd", s.H, true);
    add(Act::kKRstd, "k_rstd", s.Hkv, true);
  }
  return t;
}

std::vector<ActInfo> layer_grad_table(const LayerSpec& s) {
  const int64_t C = s.C, Q = s.q_dim(), KV = s.kv_dim();
  std::vector<ActInfo> t;
  auto add = [&](Act id, const char* name, int64_t per_row) {
    t.push_back({id, name, per_row, false, id});
  };
  add(Act::kDln, "dln", C);
  add(Act::kDatty, "datty", Q);
  add(Act::kDq, "dq", Q);
  add(Act::kDk, "dk", KV);
  add(Act::kDv, "dv", KV);
  if (s.qk_norm) {
    add(Act::kDqRaw, "dq_raw", Q);
    add(Act::kDkRaw, "dk_raw", KV);
  }
  mlp_grad_rows(t, s);
  return t;
}

ActElems act_elems(const std::vector<ActInfo>& table, int64_t N, int64_t align) {
  ActElems e;
  for (const ActInfo& r : table) {
    if (r.same_as != r.id) continue;
    const int64_t n = (N * r.per_row + align - 1) / align * align;
    (r.stat ? e.stats : e.values) += n;
  }
  return e;
}

}  // namespace rlhf::model
