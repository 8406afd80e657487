// HTTP client: Node's https / http modules (HTTP/1.1).
// A body sent without Content-Length goes chunked. See client_common.py.
'use strict';

const fs = require('fs');
const http = require('http');
const https = require('https');
const { loadSpec, Body, emit, fail } = require('./client_common');

const spec = loadSpec();
const mod = spec.url.startsWith('https:') ? https : http;
const headers = {};
for (const [name, value] of spec.headers) headers[name] = value;
if (spec.body_file && !spec.chunked) headers['content-length'] = String(fs.statSync(spec.body_file).size);

const options = { method: spec.method, headers, timeout: spec.timeout * 1000 };
if (spec.family) options.family = spec.family;

let done = false;
const finish = (fn) => (arg) => {
  if (!done) {
    done = true;
    fn(arg);
  }
};

const req = mod.request(spec.url, options, (res) => {
  const body = new Body(spec.max_body);
  res.on('data', (chunk) => body.update(chunk));
  res.on('error', finish(fail));
  res.on('end', finish(() => {
    const raw = res.rawHeaders;
    const pairs = [];
    for (let i = 0; i < raw.length; i += 2) pairs.push([raw[i].toLowerCase(), raw[i + 1]]);
    emit(Object.assign({ ok: true, status: res.statusCode, http_version: res.httpVersion, headers: pairs }, body.fields()));
  }));
});
req.on('timeout', () => req.destroy(Object.assign(new Error('request timed out'), { code: 'ETIMEDOUT' })));
req.on('error', finish(fail));

if (spec.body_file) {
  fs.createReadStream(spec.body_file).pipe(req);
} else {
  req.end();
}
