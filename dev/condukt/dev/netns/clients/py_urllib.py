"""HTTP client: Python's standard library (urllib.request).

Redirects are not followed (every client reports the first answer), and
environment proxies are ignored. See client_common.py for the spec and the
result.
"""

import ssl
import urllib.error
import urllib.request

from client_common import Body, emit, fail, file_chunks, load_spec


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def main():
    spec = load_spec()
    data = None
    if spec["body_file"]:
        # An iterable body without Content-Length is sent chunked.
        data = file_chunks(spec["body_file"]) if spec["chunked"] else open(spec["body_file"], "rb").read()
    request = urllib.request.Request(spec["url"], data=data, method=spec["method"])
    for name, value in spec["headers"]:
        request.add_header(name, value)
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}),
        urllib.request.HTTPSHandler(context=ssl.create_default_context()),
        NoRedirect(),
    )
    try:
        try:
            response = opener.open(request, timeout=spec["timeout"])
        except urllib.error.HTTPError as e:
            # A 4xx/5xx (or an unfollowed 3xx) is an answer, not a failure.
            response = e
        body = Body(spec["max_body"])
        while True:
            chunk = response.read(1 << 16)
            if not chunk:
                break
            body.update(chunk)
        version = getattr(getattr(response, "fp", None), "version", None) or getattr(response, "version", None)
        result = {
            "ok": True,
            "status": response.status if hasattr(response, "status") else response.code,
            "http_version": {10: "1.0", 11: "1.1"}.get(version),
            "headers": [[k.lower(), v] for k, v in response.headers.items()],
        }
        result.update(body.fields())
        emit(result)
    except Exception as e:  # noqa: BLE001 - every failure is reported as data
        fail(e)


if __name__ == "__main__":
    main()
