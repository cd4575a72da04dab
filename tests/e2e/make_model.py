#!/usr/bin/env python3
"""Write a tiny random-weight Llama and its tokenizer to a directory, with no download.

The real-server check needs a model vLLM will load and GuideLLM can tokenize for, and this
machine reaches no model hub. The weights do not matter (nobody reads the text): what matters
is that vLLM runs its real code path (scheduler, detokenizer, OpenAI server) at a realistic
speed, and that the tokenizer behaves like a real byte-level BPE.

    make_model.py OUT [--hidden N] [--layers N] [--heads N] [--vocab N] [--full-byte-alphabet]

The tokenizer is a byte-level BPE trained here on generated English-like text. Byte-level BPE
maps every byte to a printable stand-in character; training only sees the stand-ins of the
bytes in its text, which is all ASCII, so by default every token decodes to whole characters
and vLLM sends one event per token. With `--full-byte-alphabet` the tokenizer also gets all 256
byte tokens: a random model then emits lone bytes of multi-byte UTF-8 characters, vLLM's
detokenizer holds them back until the character is complete (or never sends them), and a stream
carries fewer events than tokens. That is the case where only the server's `usage` is exact.

Writes config.json, model.safetensors, generation_config.json, tokenizer.json and
tokenizer_config.json (with a chat template), then prints one JSON line describing the model.
"""

import argparse
import json
import os
import random
import string

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]

# A ChatML-style template: vLLM's chat endpoint refuses a tokenizer without one.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\n' }}"
    "{% if m['content'] is string %}{{ m['content'] }}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

VOCABULARY = """
the a of to in is it that for on with as was by at be this are from or have not and but
token model proxy stream latency request response server client metric time first second
rate user assistant system question answer value number count error window band speed
one two three four five six seven eight nine ten hundred thousand quick brown fox jumps
over lazy dog cat tree river mountain city road light sound water fire earth air
""".split()


def training_text(seed, lines=20000):
    """Deterministic English-like lines: enough for BPE to learn real merges, no download."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(VOCABULARY) for _ in range(rng.randint(3, 18))]
        sentence = " ".join(words).capitalize()
        out.append(f"{sentence}{rng.choice('.?!,;:')} {rng.randint(0, 99999)}")
    # Every printable ASCII character at least once, so any prompt GuideLLM makes is encodable.
    out.append(string.printable)
    return out


def build_tokenizer(vocab, full_byte_alphabet, seed):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet() if full_byte_alphabet else []
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(training_text(seed), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok


def never_emit_special_tokens(model, special_ids):
    """Make the random model unable to sample a special token.

    vLLM drops special tokens from the text it streams, so a sampled `<s>` would be a token
    with no event even with the default alphabet, and the default model must give exactly one
    event per token. Every embedding gets a large constant in dimension 0; the residual stream
    keeps it through the few small random layers, so after the final norm dimension 0 of the
    hidden state is large and positive at every position. The output rows of the special
    tokens get a large negative weight on that dimension (their logits sink far below the
    rest) and the other rows none (their distribution stays as random as before).
    """
    import torch

    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        head = model.lm_head.weight
        head[:, 0] = 0.0
        head[special_ids, 0] = -100.0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--full-byte-alphabet", action="store_true")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)

    import torch
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    tok = build_tokenizer(a.vocab, a.full_byte_alphabet, a.seed)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="</s>",
        model_max_length=a.context,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(a.out)

    torch.manual_seed(a.seed)
    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=a.hidden,
        intermediate_size=a.hidden * 4,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.heads,
        max_position_embeddings=a.context,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(cfg).to(torch.float32)
    never_emit_special_tokens(model, [tok.token_to_id(t) for t in SPECIAL_TOKENS])
    model.save_pretrained(a.out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.pad_token_id,
    ).save_pretrained(a.out)

    params = sum(t.numel() for t in model.parameters())
    print(
        json.dumps(
            {
                "out": a.out,
                "vocab": cfg.vocab_size,
                "params": params,
                "hidden": a.hidden,
                "layers": a.layers,
                "full_byte_alphabet": a.full_byte_alphabet,
            }
        )
    )


if __name__ == "__main__":
    main()
