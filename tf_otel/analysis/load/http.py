"""GET a JSON document over HTTP with one clear error on failure (used by Jaeger / Tempo)."""

from __future__ import annotations

import http.client
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, Optional

from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.load._json import DECODE_ERRORS, loads


def build_url(base: str, path: str, query: Optional[Dict[str, Any]] = None) -> str:
    url = base.rstrip("/") + path
    if query:
        pairs = {key: value for key, value in query.items() if value is not None}
        url += "?" + urllib.parse.urlencode(pairs)
    return url


def url_part(text: Any) -> str:
    """``text`` as one path segment (an id from a server or a user may hold '/', ' ', ...)."""
    return urllib.parse.quote(str(text), safe="")


def get_json(url: str, timeout_s: float = 30.0) -> Any:
    try:
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        raise AnalysisError(f"{url}: HTTP {error.code} {error.reason}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise AnalysisError(f"{url}: cannot connect ({reason})") from None
    except (ValueError, http.client.InvalidURL) as error:  # no http:// scheme, a bad port ...
        raise AnalysisError(f"{url}: not a usable URL ({error})") from None
    except http.client.HTTPException as error:  # not HTTP, or the body cut short
        raise AnalysisError(f"{url}: bad HTTP response ({error!r})") from None
    try:
        return loads(body)
    except DECODE_ERRORS:
        raise AnalysisError(f"{url}: response is not JSON") from None
