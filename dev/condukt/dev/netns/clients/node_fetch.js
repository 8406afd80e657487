// HTTP client: Node's built-in fetch (undici, HTTP/1.1). Redirects are not
// followed; a streamed body goes chunked. fetch has no address-family
// option, so a spec with `family` is refused. See client_common.py.
'use strict';

const fs = require('fs');
const { Readable } = require('stream');
const { loadSpec, Body, emit, fail } = require('./client_common');

async function main() {
  const spec = loadSpec();
  if (spec.family) throw new Error('node fetch cannot pin an address family');
  const init = {
    method: spec.method,
    headers: spec.headers,
    redirect: 'manual',
    signal: AbortSignal.timeout(spec.timeout * 1000),
  };
  if (spec.body_file) {
    if (spec.chunked) {
      init.body = Readable.toWeb(fs.createReadStream(spec.body_file));
      init.duplex = 'half';
    } else {
      init.body = fs.readFileSync(spec.body_file);
    }
  }
  const res = await fetch(spec.url, init);
  const body = new Body(spec.max_body);
  if (res.body) for await (const chunk of res.body) body.update(chunk);
  const headers = [];
  res.headers.forEach((value, name) => headers.push([name, value]));
  // undici speaks HTTP/1.1 only, and fetch does not expose the version.
  emit(Object.assign({ ok: true, status: res.status, http_version: null, headers }, body.fields()));
}

main().catch(fail);
