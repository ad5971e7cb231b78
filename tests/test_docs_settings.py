"""Every setting of StoreConfig is documented, with its Kafka name, in docs/operations.rst."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kvlog.config import KAFKA_NAMES, StoreConfig

OPERATIONS = Path(__file__).resolve().parent.parent / "docs" / "operations.rst"


def test_every_setting_is_documented_with_its_default_and_kafka_name() -> None:
    text = OPERATIONS.read_text()
    for field in dataclasses.fields(StoreConfig):
        assert f"``{field.name}``" in text, field.name
        assert f"``{field.default!r}``" in text, (field.name, field.default)
        if field.name in KAFKA_NAMES:
            assert f"``{KAFKA_NAMES[field.name]}``" in text, field.name
