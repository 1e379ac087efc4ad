"""Train a small Llama-style causal LM with the Hugging Face Trainer: a plain script, written
for transformers and nothing else. The model is built from a config (no download), the text is
data/corpus.txt, tokenised by characters.

    python train.py --output_dir out --per_device_train_batch_size 8 --max_steps 100
"""

from dataclasses import dataclass, field

import torch
from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    attn_implementation: str = field(default="eager", metadata={"help": "eager or sdpa"})
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    block_size: int = 64


class CharDataset(torch.utils.data.Dataset):
    """Fixed-length windows of a character-tokenised text."""

    def __init__(self, path: str, block_size: int):
        text = open(path, encoding="utf-8").read()
        self.vocab = sorted(set(text))
        index = {ch: i for i, ch in enumerate(self.vocab)}
        self.ids = [index[ch] for ch in text]
        self.block_size = block_size

    def __len__(self):
        return (len(self.ids) - 1) // self.block_size

    def __getitem__(self, i):
        start = i * self.block_size
        window = self.ids[start : start + self.block_size]
        return {"input_ids": window, "labels": window}


def collate(examples):
    return {key: torch.tensor([example[key] for example in examples]) for key in ("input_ids", "labels")}


class CausalLMTrainer(Trainer):
    """The Trainer, logging next-token accuracy beside the loss."""

    accuracy = 0.0

    def log(self, logs, *args, **kwargs):
        super().log({**logs, "accuracy": round(self.accuracy, 4)}, *args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # num_items_in_batch: the loss is a mean over the whole accumulated batch, not per micro-batch
        outputs = model(**inputs, num_items_in_batch=num_items_in_batch)
        with torch.no_grad():  # next-token accuracy, for the logs
            logits = model(**inputs).logits
            accuracy = (logits[:, :-1].argmax(-1) == inputs["labels"][:, 1:]).float().mean()
        self.accuracy = accuracy.item()
        return (outputs.loss, outputs) if return_outputs else outputs.loss


def main():
    parser = HfArgumentParser((ModelArguments, TrainingArguments))
    model_args, training_args = parser.parse_args_into_dataclasses()
    torch.manual_seed(training_args.seed)
    dataset = CharDataset("data/corpus.txt", model_args.block_size)
    config = LlamaConfig(
        vocab_size=len(dataset.vocab),
        hidden_size=model_args.hidden_size,
        intermediate_size=4 * model_args.hidden_size,
        num_hidden_layers=model_args.num_hidden_layers,
        num_attention_heads=model_args.num_attention_heads,
        num_key_value_heads=model_args.num_attention_heads,
        max_position_embeddings=model_args.block_size,
    )
    config._attn_implementation = model_args.attn_implementation
    model = LlamaForCausalLM(config)
    trainer = CausalLMTrainer(model=model, args=training_args, train_dataset=dataset, data_collator=collate)
    trainer.train()


if __name__ == "__main__":
    main()
