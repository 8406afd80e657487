// Shared parts of the testbed's Node clients; the spec and the result are
// those of client_common.py (one JSON argument in, one JSON line out).
// Trust comes from NODE_EXTRA_CA_CERTS only, as it would in a workspace.
'use strict';

const crypto = require('crypto');

function loadSpec() {
  const spec = JSON.parse(process.argv[2]);
  return Object.assign(
    { method: 'GET', headers: [], body_file: null, chunked: false, timeout: 20, max_body: 1 << 20, family: null },
    spec
  );
}

class Body {
  constructor(maxBody) {
    this.maxBody = maxBody;
    this.hash = crypto.createHash('sha256');
    this.size = 0;
    this.kept = [];
  }

  update(chunk) {
    this.hash.update(chunk);
    this.size += chunk.length;
    if (this.size <= this.maxBody) this.kept.push(Buffer.from(chunk));
  }

  fields() {
    return {
      body_sha256: this.hash.digest('hex'),
      body_size: this.size,
      body_b64: this.size <= this.maxBody ? Buffer.concat(this.kept).toString('base64') : null,
    };
  }
}

const TLS_VERIFY = new Set([
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'UNABLE_TO_GET_ISSUER_CERT',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'ERR_TLS_CERT_ALTNAME_INVALID',
  'CERT_HAS_EXPIRED',
  'CERT_NOT_YET_VALID',
  'CERT_SIGNATURE_FAILURE',
]);

// Maps an error (and its `cause` chain, which fetch uses) to a coarse kind.
function classify(err) {
  const parts = [];
  const codes = [];
  for (let e = err, depth = 0; e && depth < 5; e = e.cause, depth++) {
    parts.push(`${e.name || 'Error'}: ${e.message}${e.code ? ` (${e.code})` : ''}`);
    if (e.code) codes.push(e.code);
  }
  const text = parts.join(' | ');
  let kind = 'other';
  if (codes.some((c) => TLS_VERIFY.has(c))) kind = 'tls_verify';
  else if (codes.includes('ECONNREFUSED')) kind = 'refused';
  else if (codes.some((c) => ['ENOTFOUND', 'EAI_AGAIN'].includes(c))) kind = 'dns';
  else if (codes.some((c) => ['ETIMEDOUT', 'UND_ERR_CONNECT_TIMEOUT', 'ABORT_ERR', 'UND_ERR_HEADERS_TIMEOUT'].includes(c)) || /timeout|timed out/i.test(text))
    kind = 'timeout';
  else if (codes.some((c) => ['ECONNRESET', 'EPIPE', 'UND_ERR_SOCKET'].includes(c)) || /socket hang up|other side closed/i.test(text))
    kind = 'reset';
  return { error: text, error_kind: kind };
}

function emit(result) {
  const base = {
    ok: false,
    status: null,
    http_version: null,
    headers: [],
    body_b64: null,
    body_sha256: null,
    body_size: null,
    error: null,
    error_kind: null,
    data: {},
  };
  process.stdout.write(JSON.stringify(Object.assign(base, result)) + '\n');
}

function fail(err) {
  emit(Object.assign({ ok: false }, classify(err)));
  process.exitCode = 1;
}

module.exports = { loadSpec, Body, classify, emit, fail };
