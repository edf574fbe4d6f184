"""Operations: health and readiness probes, outages answered with 503, and ``manage.py tms_check``."""
