"""Reward functions of configs/dataset_tiny.toml. keelrl calls each as fn(completion, **row): the completion's
text, then every field of the data row ("prompt", "answer", "digits") as keyword arguments."""

import re


def exact_match(completion: str, answer: str, **row: object) -> float:
    """1.0 when the first number the model writes is the row's answer."""
    number = re.search(r"-?\d+", completion)
    return float(number is not None and number.group() == answer)


def starts_with_number(completion: str, **row: object) -> float:
    """1.0 when the completion starts with a number: a little shaping while answers are still wrong."""
    return float(re.match(r"\s*-?\d", completion) is not None)
