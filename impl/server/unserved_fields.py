"""Request fields of SGLang's and vLLM's APIs that this server does not serve, with the value that means "unused".

The request bodies ignore fields they do not know (clients send more than any one server reads), so a field that
would change the answer, or promise work that is not done, is listed here: a request giving it another value than
its unused one is a 400 naming the field and what to do instead (``protocol.refuse_unserved``). Fields that change
nothing one server could act on (a session id, metric labels, a trace header) are not listed: they pass.
"""

from __future__ import annotations

TEXT_ONLY = "Gemma-4's text model is served here; images, audio and video are not read"

# field -> (its unused values, what to do instead); a batch (a list of unused values) is unused too
Unserved = dict[str, tuple[tuple, str]]

_MULTIMODAL: Unserved = {name: ((None, False), TEXT_ONLY) for name in (
    "mm_processor_kwargs", "images_config", "video_config", "use_audio_in_video", "max_dynamic_patch",
    "min_dynamic_patch")}

# Both routes: fields SGLang's /generate and the OpenAI routes (SGLang's or vLLM's) share
_BOTH: Unserved = {
    "priority": ((None, 0), "priority scheduling is not served; send 0"),
    "extra_key": ((None,), "send cache_salt to keep a tenant's prefixes apart"),
    "watermark": ((None,), "not implemented"),
    "return_routed_experts": ((None, False), "Gemma-4 E2B has no experts"),
    "routed_experts_start_len": ((None, 0), "Gemma-4 E2B has no experts"),
    "return_sampling_mask": ((None, False), "not implemented"),
    "sampling_logprobs_mode": ((None,), "logprobs are the sampled distribution's (before top-k / top-p)"),
}

# Both OpenAI routes (vLLM's extensions and SGLang's)
OPENAI_UNSERVED: Unserved = {
    **_MULTIMODAL,
    **_BOTH,
    "reasoning_effort": ((None,), "Gemma-4's template switches thinking with chat_template_kwargs.enable_thinking"),
    "thinking": ((None,), "Gemma-4's template switches thinking with chat_template_kwargs.enable_thinking"),
    "include_reasoning": ((None, True), "reasoning is not separated from the answer here"),
    "separate_reasoning": ((None, True), "reasoning is not separated from the answer here"),
    "stream_reasoning": ((None, True), "reasoning is not separated from the answer here"),
    "thinking_token_budget": ((None,), "not implemented; bound the answer with max_tokens"),
    "task": ((None,), "not implemented"),
    "repetition_detection": ((None,), "not implemented; use frequency_penalty or stop"),
    "stop_regex": ((None,), "not implemented; use stop strings, or constrain the output with regex"),
    "logprob_token_ids": ((None,), "not implemented; use logprobs / top_logprobs"),
    "documents": ((None,), "the chat template takes no documents here; put them in the messages"),
    "chat_template": ((None,), "a request's own template is not run; start the server with --chat-template"),
    "input_ids": ((None,), "send messages (chat) or a prompt of token ids to /v1/completions"),
    "media_io_kwargs": ((None,), TEXT_ONLY),
    "mm_payload": ((None,), TEXT_ONLY),
    "prompt_embeds": ((None,), "send the prompt as text or token ids"),
    "lora_path": ((None, ""), "LoRA adapters are not served"),
    "session_params": ((None,), "sessions are not kept; send the whole conversation"),
    "custom_logit_processor": ((None,), "custom logit processors are not run; use logit_bias"),
    "custom_params": ((None,), "no custom sampling parameters are read"),
    "vllm_xargs": ((None,), "no extra sampling arguments are read"),
    "watermarking": ((None, False), "not implemented"),
    "kv_transfer_params": ((None,), "KV transfer between servers is not served"),
    "ec_transfer_params": ((None,), "encoder cache transfer is not served"),
    "return_hidden_states": ((None, False), "hidden states are not returned"),
    "routed_experts_prompt_start": ((None, 0), "Gemma-4 E2B has no experts"),
    "return_spec_tokens_details": ((None, False), "speculative stats are in /generate's meta_info"),
    "return_meta_info": ((None, False), "use /generate for SGLang's meta_info"),
    "return_prompt_token_ids": ((None, False), "send return_token_ids (vLLM's)"),
    "return_input_ids_in_sglext": ((None, False), "send return_token_ids (vLLM's)"),
    "return_output_ids_in_sglext": ((None, False), "send return_token_ids (vLLM's)"),
    "return_flat_raw_output_top_logprobs": ((None, False), "use logprobs / top_logprobs"),
    "return_token_offsets": ((None, False), "not implemented"),
    "return_prompt_text": ((None, False), "not implemented; POST /tokenize with the messages, then /detokenize"),
    "return_mm_kwargs": ((None, False), TEXT_ONLY),
    "spaces_between_special_tokens": ((None, True), "special tokens are decoded as the tokenizer writes them"),
    "stream_interval": ((None,), "the server's --stream-interval sets it"),
}

# POST /generate (SGLang's GenerateReqInput); image / audio / video data, input_embeds, lora, hidden states,
# token_ids_logprob, custom_logit_processor and session_params are declared fields of its model
GENERATE_UNSERVED: Unserved = {
    **_MULTIMODAL,
    **_BOTH,
    "mm_hashes": ((None,), TEXT_ONLY),
    "mm_content_hashes": ((None,), TEXT_ONLY),
    "modalities": ((None,), TEXT_ONLY),
    "image_max_dynamic_patch": ((None,), TEXT_ONLY),
    "video_max_dynamic_patch": ((None,), TEXT_ONLY),
    "encoder_urls": ((None,), TEXT_ONLY),
    "need_wait_for_mm_inputs": ((None, False), TEXT_ONLY),
    "num_items_assigned": ((None,), TEXT_ONLY),
    "return_flat_raw_top_logprobs": ((None, False), "use top_logprobs_num"),
    "return_flat_raw_output_top_logprobs": ((None, False), "use top_logprobs_num"),
    "return_flat_raw_top_logprobs_b64": ((None, False), "use top_logprobs_num"),
    "return_indexer_topk": ((None, False), "not implemented"),
    "positional_embed_overrides": ((None,), "not implemented"),
    "bootstrap_host": ((None,), "prefill / decode disaggregation is not served"),
    "bootstrap_port": ((None,), "prefill / decode disaggregation is not served"),
    "bootstrap_room": ((None,), "prefill / decode disaggregation is not served"),
    "bootstrap_pair_key": ((None,), "prefill / decode disaggregation is not served"),
    "decode_tp_size": ((None,), "prefill / decode disaggregation is not served"),
    "routed_dp_rank": ((None,), "the --dp-size front routes each request by load"),
    "disagg_prefill_dp_rank": ((None,), "prefill / decode disaggregation is not served"),
    "background": ((None, False), "requests are answered in the foreground"),
    "require_reasoning": ((None, False), "reasoning is not separated from the answer here"),
    "max_thinking_tokens": ((None,), "not implemented; bound the answer with max_new_tokens"),
    "return_bytes": ((None, False), "not implemented"),
    "return_entropy": ((None, False), "not implemented; compute it from top_logprobs_num"),
    "multi_item_delimiter_indices": ((None,), "multi-item scoring is not served"),
    "token_indices_to_pool": ((None,), "pooling is not served"),
    "kv_hints": ((None,), "not implemented"),
}
