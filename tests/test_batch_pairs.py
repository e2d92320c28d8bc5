"""A loss term that pairs the batch's rows with each other (issue 24): found once (anatomy/batch_pairs.py),
advised on by convert (every target that splits the batch by ranks) and warned on by lint (DDP027).

Under DDP each rank pairs its own rows only, so such a term's mean over the ranks misses the pairs across
ranks: the conversion trains, not identically (verify sees it at run time: tests/test_verify_pairs.py).
"""

from __future__ import annotations

import pytest

from ddpify.anatomy import analyze
from ddpify.anatomy.batch_pairs import batch_pairs
from ddpify.codemods.ddp.paired_rows import NOTE, SUPPRESSION
from ddpify.codemods.pipeline import Status
from ddpify.convert import convert_source
from ddpify.lint.engine import check_text, rule_set
from ddpify.lint.registry import all_rules
from test_verify_pairs import EMBEDDING_NET

DEFAULT_RULES = rule_set(frozenset(r.code for r in all_rules() if r.default_enabled))
PRODUCT = "torch.matmul(unit, unit.transpose(1, 0))"
TRAINING = """import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


""" + EMBEDDING_NET + """

def pull_away(embeddings):
    unit = embeddings / embeddings.norm(dim=1, keepdim=True)
    similarity = PRODUCT
    rows = embeddings.size(0)
    return (similarity.sum() - rows) / (rows * (rows - 1))


def main():
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for xb, yb in loader:
            prediction, embedding = model(xb)
            loss = F.mse_loss(prediction, yb) + 0.5 * TERM
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
"""


def script(term: str = "pull_away(embedding)", product: str = PRODUCT) -> str:
    return TRAINING.replace("TERM", term).replace("PRODUCT", product)


def pairs_advice(result) -> list[tuple[int, str]]:
    return [(a.line, a.message) for a in result.advice if "pairs the batch's rows" in a.message]


@pytest.mark.parametrize("target", ["ddp", "fsdp", "accelerate"])
def test_convert_advises_on_the_line_of_a_term_pairing_the_rows(target):
    text = script()
    result = convert_source(text, target)
    assert result.status is Status.CONVERTED, result.reason
    [(line, message)] = pairs_advice(result)
    assert text.splitlines()[line - 1].strip() == f"similarity = {PRODUCT}"
    assert PRODUCT in message and "torch.distributed.nn.functional.all_gather" in message and "within each rank" in message
    assert "pairs the batch's rows" not in result.output  # advice, not a comment in the converted file


@pytest.mark.parametrize("term", [
    "pull_away(torch.cat(torch.distributed.nn.functional.all_gather(embedding)))",  # every rank's rows
    "embedding.pow(2).mean()",  # row by row
])
def test_convert_gives_no_such_advice_where_no_rank_pairs_its_own_rows_only(term):
    assert pairs_advice(convert_source(script(term), "ddp")) == []


def test_the_dataparallel_conversion_computes_the_term_on_the_whole_batch():
    assert pairs_advice(convert_source(script(), "dp")) == []


def test_the_converted_statement_says_it_pairs_each_ranks_rows_and_lints_clean_only_by_saying_so():
    output = convert_source(script(), "ddp").output
    lines = output.splitlines()
    at = lines.index(f"    similarity = {PRODUCT}  {SUPPRESSION}")
    assert " ".join(comments_above(lines, at)) == NOTE.removeprefix("# ")  # reflowed to the file's width
    assert check_text(output, "train.py", DEFAULT_RULES) == ([], [])
    findings, _ = check_text(output.replace(f"  {SUPPRESSION}", ""), "train.py", DEFAULT_RULES)
    assert [(d.code, d.severity, d.pos.line) for d in findings] == [("DDP027", "warning", at + 1)]


def test_a_comment_of_the_users_own_moves_above_the_statement():
    text = script().replace(f"similarity = {PRODUCT}", f"similarity = {PRODUCT}  # cosine similarities")
    result = convert_source(text, "ddp")
    assert result.status is Status.CONVERTED, result.reason
    lines = result.output.splitlines()
    above = comments_above(lines, lines.index(f"    similarity = {PRODUCT}  {SUPPRESSION}"))
    assert above[0] == "cosine similarities" and " ".join(above[1:]) == NOTE.removeprefix("# ")


def test_a_statement_too_wide_for_the_file_keeps_its_suppression_on_its_line():
    returned = "    return ((unit @ unit.t()).sum() - rows) / (rows * (rows - 1))"
    text = script().replace(f"    similarity = {PRODUCT}\n", "").replace("    return (similarity.sum() - rows) / (rows * (rows - 1))", returned)
    result = convert_source(text, "ddp")
    assert result.status is Status.CONVERTED, result.reason
    assert f"{returned}  {SUPPRESSION}" in result.output.splitlines()  # 87 columns: the file's own width is 79


def comments_above(lines: list[str], at: int) -> list[str]:
    """The text of the comment lines just above line index `at`."""
    start = at
    while lines[start - 1].lstrip().startswith("#"):
        start -= 1
    return [line.strip().removeprefix("# ") for line in lines[start:at]]


def found(product: str, term: str = "pull_away(embedding)") -> list[str]:
    return [pair.code for pair in batch_pairs(analyze(script(term, product)))]


@pytest.mark.parametrize("product", [
    "unit @ unit.t()", "unit @ unit.T", "torch.mm(unit, torch.t(unit))", "unit.mm(unit.t())", "unit.matmul(unit.permute(1, 0))",
    "torch.cdist(unit, unit)", "unit.unsqueeze(0) - unit.unsqueeze(1)", "unit[:, None] * unit[None, :]",
    "F.cosine_similarity(unit.unsqueeze(1), unit.unsqueeze(0), dim=-1)",  # SimCLR's NT-Xent similarities
])
def test_each_spelling_of_a_pairing_is_found(product):
    assert found(product) == [product]


@pytest.mark.parametrize("product", [
    "unit @ unit.transpose(-2, -1)",  # the last two dims swapped: attention's tokens, not the rows
    "unit @ unit.transpose(1, 2)",
    "unit.unsqueeze(1) - unit.unsqueeze(2)",
    "F.cosine_similarity(unit[None], unit[None], dim=-1)",  # rows by the same rows
    "unit @ unit",  # no transpose: a product of features
])
def test_what_pairs_no_rows_is_not_found(product):
    assert found(product) == []


def test_a_parameter_and_a_model_attribute_are_no_rows():
    assert found("unit @ model_weight.t()") == []
    assert found(PRODUCT, term="(embedding @ model.head.weight.t()).mean()") == []


def test_a_product_in_a_models_own_forward_is_not_searched():
    text = script(term="embedding.mean()").replace("embedding = self.embed(x)", "embedding = self.embed(x)\n        embedding = embedding @ embedding.t() @ embedding")
    assert batch_pairs(analyze(text)) == ()


def test_a_pairing_that_reaches_no_backward_is_not_found():
    text = script(term="embedding.mean()").replace("optimizer.step()", "optimizer.step()\n            print(pull_away(embedding).item())")
    assert batch_pairs(analyze(text)) == ()
