"""HTTP client: python3-requests (urllib3 underneath).

Trust comes from REQUESTS_CA_BUNDLE; redirects are not followed; a
generator body is sent chunked. See client_common.py for the spec and the
result.
"""

import requests

from client_common import Body, emit, fail, file_chunks, load_spec


def main():
    spec = load_spec()
    data = None
    if spec["body_file"]:
        data = file_chunks(spec["body_file"]) if spec["chunked"] else open(spec["body_file"], "rb").read()
    try:
        with requests.Session() as session:
            # Only the CA variables of the environment, not its proxies.
            session.proxies = {}
            response = session.request(
                spec["method"],
                spec["url"],
                headers=dict(spec["headers"]),
                data=data,
                timeout=spec["timeout"],
                allow_redirects=False,
                stream=True,
                proxies={"http": None, "https": None},
            )
            body = Body(spec["max_body"])
            for chunk in response.raw.stream(1 << 16, decode_content=False):
                body.update(chunk)
            result = {
                "ok": True,
                "status": response.status_code,
                "http_version": {10: "1.0", 11: "1.1"}.get(response.raw.version),
                "headers": [[k.lower(), v] for k, v in response.headers.items()],
            }
            result.update(body.fields())
            emit(result)
    except Exception as e:  # noqa: BLE001 - every failure is reported as data
        fail(e)


if __name__ == "__main__":
    main()
