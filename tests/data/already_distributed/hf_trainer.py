import torch
from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments


class WeightedTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        outputs = model(**inputs)
        loss = torch.nn.functional.cross_entropy(outputs.logits, inputs["labels"])
        return (loss, outputs) if return_outputs else loss


def main(train_dataset):
    model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased", num_labels=2)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, num_train_epochs=1)
    trainer = WeightedTrainer(model=model, args=args, train_dataset=train_dataset)
    trainer.train()
    print("done")
