// PEFT LoRA adapters on disk: a folder with adapter_config.json (peft_type "LORA", r,
// lora_alpha, target_modules, lora_dropout, ...) and adapter_model.safetensors, whose keys are
// `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` (r, in) and `...lora_B.weight`
// (out, r) — what peft.PeftModel.save_pretrained writes and PeftModel.from_pretrained loads.
#pragma once

#include <string>
#include <vector>

#include <memory>

#include "io/tensor_source.h"
#include "model/config.h"
#include "model/lora.h"

namespace rlhf::io {

/// The LoRA settings of `dir`/adapter_config.json: r, lora_alpha, target_modules (a list, or
/// "all-linear"), lora_dropout. Throws rlhf::Error naming the file and key for a missing or
/// unreadable file, peft_type other than LORA, and the options rlhf does not implement
/// (use_rslora, use_dora, bias other than "none", fan_in_fan_out, rank_pattern/alpha_pattern,
/// target modules outside the decoder layers' projections, modules_to_save other than PEFT's
/// SEQ_CLS ["classifier", "score"], which sets save_score).
model::LoraConfig read_peft_adapter_config(const std::string& dir);

/// The adapter weights of `dir`/adapter_model.safetensors into the flat buffer of `layout`
/// (layout.numel() floats; F32/F16/BF16 converted to fp32). Throws rlhf::Error naming the file
/// and tensor for a missing tensor, a shape other than the layout's, or a tensor that is not one
/// of the layout's (another target, an embedding adapter, modules_to_save other than the score
/// head). The score head of modules_to_save is `base_model.model.score.weight` (1, C) in the file.
std::vector<float> read_peft_adapter_weights(const std::string& dir,
                                             const model::LoraLayout& layout);

/// Writes a PEFT adapter folder `dir` (created; files via .tmp + rename): adapter_config.json
/// (task_type CAUSAL_LM, or SEQ_CLS with modules_to_save ["classifier", "score"] when the layout
/// has the score head; base_model_name_or_path = base) and adapter_model.safetensors (fp32) from
/// the flat buffer `adapters` laid out by `layout`. Throws rlhf::Error on I/O failure.
void write_peft_adapter(const std::string& dir, const model::LoraLayout& layout,
                        const float* adapters, const std::string& base);

/// The tensors of `base` with the adapters merged: every adapted projection weight of layer l reads
/// as W + (α/r)·B·A (model::lora_merge_cpu, fp32), score.weight as the adapter's trained copy when
/// the layout has one, everything else as `base` has it. `layout` must
/// be the model's (LoraLayout of its config); `adapters` is copied.
std::shared_ptr<const TensorSource> merge_lora_tensors(std::shared_ptr<const TensorSource> base,
                                                       const model::LoraLayout& layout,
                                                       std::vector<float> adapters);

}  // namespace rlhf::io
