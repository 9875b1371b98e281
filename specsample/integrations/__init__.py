"""Integrations with serving engines, each in its own package.

The core of specsample never imports from here: an integration is a client of the public
API (:func:`specsample.verify`) that speaks an engine's types. Each subpackage needs its
engine installed (for :mod:`specsample.integrations.vllm`, ``make test-vllm`` sets up vLLM on
the CPU in the source checkout, ``pip install -e '.[vllm]'`` there installs it with its GPU
dependencies).
"""
