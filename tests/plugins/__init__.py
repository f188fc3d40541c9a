"""Fixtures the whole suite shares, as pytest plugins (listed in ``tests/conftest.py``)."""
