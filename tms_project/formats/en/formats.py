"""Date and time formats for English, the project's language: times always show seconds.

Django's own English formats print "11:54 a.m.", so seven events a few seconds apart read the
same. Installed with ``FORMAT_MODULE_PATH``; they apply to the admin and every template.
https://docs.djangoproject.com/en/5.2/topics/i18n/formatting/#creating-custom-format-files
"""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s"
TIME_FORMAT = "H:i:s"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
# Input: ISO 8601 first, with fractions of a second (start_at keeps its microseconds).
DATETIME_INPUT_FORMATS = [
    "%Y-%m-%d %H:%M:%S.%f",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%d %H:%M",
    "%Y-%m-%d",
]
