# SPDX-License-Identifier: Apache-2.0
"""Opt-in integrations with other libraries (each enabled by an explicit call; nothing is patched at import)."""
