"""The key, text and queue-name rules of scheduler.rules, spelled as JSON Schema patterns for
/openapi.json, so that clients and fuzzers know what the validators accept.

The character ranges are written out rather than computed from `unicodedata` at start-up (a
scan of every code point takes ~0.5 s); tests/test_openapi_routes.py checks them against the
rules for every code point, so a rule change or a new Unicode version cannot leave them stale.
"""

from __future__ import annotations

import re
from typing import Any

from tickler.scheduler import rules
from tickler.scheduler.states import SEARCH_STATUSES

# Code points rules.check_key refuses: '/', whitespace, and categories Cc, Cf, Cs, Zl, Zp.
KEY_FORBIDDEN: tuple[tuple[int, int], ...] = (
    (0x0000, 0x0020), (0x002F, 0x002F), (0x007F, 0x00A0), (0x00AD, 0x00AD), (0x0600, 0x0605),
    (0x061C, 0x061C), (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891), (0x08E2, 0x08E2),
    (0x1680, 0x1680), (0x180E, 0x180E), (0x2000, 0x200F), (0x2028, 0x202F), (0x205F, 0x2064),
    (0x2066, 0x206F), (0x3000, 0x3000), (0xD800, 0xDFFF), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x13438), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)  # fmt: skip

# Code points rules.check_text refuses: categories Cc and Cs, except tab and newline.
TEXT_FORBIDDEN: tuple[tuple[int, int], ...] = ((0x0000, 0x0008), (0x000B, 0x001F), (0x007F, 0x009F), (0xD800, 0xDFFF))


def _char(code: int) -> str:
    # BMP code points as \uXXXX escapes (read the same by ECMA-262, Python and Rust regexes);
    # the others as themselves, since ECMA-262 without the `u` flag has no escape for them.
    return f"\\u{code:04X}" if code <= 0xFFFF else chr(code)


def _negated_class(forbidden: tuple[tuple[int, int], ...]) -> str:
    # Lone surrogates cannot travel in UTF-8 JSON, and Rust's regex (jsonschema-rs) refuses them
    # in a pattern: they are left out of the class, and the validators still refuse them.
    parts = [
        _char(low) if low == high else f"{_char(low)}-{_char(high)}"
        for low, high in forbidden
        if not 0xD800 <= low <= 0xDFFF
    ]
    return "[^" + "".join(parts) + "]"


KEY_PATTERN = f"^{_negated_class(KEY_FORBIDDEN)}+$"
TEXT_PATTERN = f"^{_negated_class(TEXT_FORBIDDEN)}*$"
QUEUE_NAME_PATTERN = rules.QUEUE_NAME.pattern
_STATUS = "(?:{})".format("|".join(sorted(SEARCH_STATUSES)))
STATUSES_PATTERN = f"^{_STATUS}(?:,{_STATUS})*$"
# A webhook URL: http(s), a host name (or IPv4 address), an optional port and path. Narrower than
# what the validator accepts (IPv6 hosts, for one), never wider.
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = f"(?:[0-9]{{1,3}}(?:\\.[0-9]{{1,3}}){{3}}|{_LABEL}|(?:{_LABEL}\\.)+[A-Za-z]{{2,6}})"
URL_PATTERN = f"^https?://{_HOST}(?::[0-9]{{1,5}})?(?:/[A-Za-z0-9._~%!$&'()*+,;=:@-]*)*$"


# A search's cursor: URL-safe base64 (scheduler/store/search.py encodes one), checked before the
# store decodes it.
CURSOR_PATTERN = "^[A-Za-z0-9_-]+={0,2}$"
# A five-field cron expression as scheduler/cron.py reads it: each field a list of `*`, a value or
# a range, each with an optional /step, within the field's range (0 or 7 = Sunday; names of months
# and days). What it cannot say: a day that never comes (30 2 *), a reversed range (5-1).
_STEP = "(?:/0*[1-9][0-9]*)?"


def _cron_field(value: str) -> str:
    item = f"(?:\\*|{value}(?:-{value})?){_STEP}"
    return f"{item}(?:,{item})*"


def _names(*names: str) -> str:
    """Names in any case, as the parser reads them (JSON Schema patterns have no `i` flag)."""
    return "|".join("".join(f"[{c.lower()}{c.upper()}]" for c in name) for name in names)


_MONTHS = _names("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = _names("sun", "mon", "tue", "wed", "thu", "fri", "sat")
CRON_PATTERN = "^\\s*{}$".format(
    "\\s+".join(
        _cron_field(value)
        for value in (
            "(?:[0-5]?[0-9])",
            "(?:[01]?[0-9]|2[0-3])",
            "(?:0?[1-9]|[12][0-9]|3[01])",
            f"(?:0?[1-9]|1[0-2]|{_MONTHS})",
            f"(?:[0-7]|{_DAYS})",
        )
    )
    + "\\s*"
)

# An item_key is also not one of the keys its URL cannot address.
ITEM_KEY_PATTERN = "^(?!(?:{})$)".format("|".join(re.escape(k) for k in rules.UNADDRESSABLE_KEYS)) + KEY_PATTERN[1:]


def key_metadata() -> dict[str, object]:
    return {"pattern": KEY_PATTERN, "minLength": 1, "maxLength": rules.MAX_KEY_LENGTH}


def item_key_metadata() -> dict[str, object]:
    return {**key_metadata(), "pattern": ITEM_KEY_PATTERN}


def text_metadata(max_length: int) -> dict[str, object]:
    return {"pattern": TEXT_PATTERN, "maxLength": max_length}


def queue_name_metadata() -> dict[str, object]:
    return {"pattern": QUEUE_NAME_PATTERN}


# Rules across fields, as JSON Schema keywords for the schemas whose validators enforce them.
NOT_BOTH_WHEN: dict[str, Any] = {"not": {"required": ["schedule_on", "delay_seconds"]}}
AT_LEAST_ONE_FILTER: dict[str, Any] = {"anyOf": [{"required": ["group_key"]}, {"required": ["item_key_prefix"]}]}
