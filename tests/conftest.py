"""Shared test configuration: no network access, modest hypothesis settings."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
