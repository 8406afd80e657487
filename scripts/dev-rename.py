#!/usr/bin/env python3
"""One-off helper for merges: renames the namespace-testbed modules that
moved from test/support to dev/ (Condukt.Test.Netns.{Cmd,Tier,Pki,Nginx,
Client,Testbed} -> Condukt.Dev.Netns.*, Condukt.Test.SystemTools ->
Condukt.Dev.SystemTools) in every Elixir file given or found."""
import re, sys, pathlib
MOVED = {"Cmd", "Tier", "Pki", "Nginx", "Client", "Testbed"}
def fix(text):
    text = text.replace("Condukt.Test.SystemTools", "Condukt.Dev.SystemTools")
    def brace(m):
        indent, names = m.group(1), [n.strip() for n in m.group(2).split(",")]
        moved = [n for n in names if n.split(".")[0] in MOVED]
        kept = [n for n in names if n.split(".")[0] not in MOVED]
        out = []
        for prefix, group in (("Condukt.Dev.Netns", moved), ("Condukt.Test.Netns", kept)):
            if len(group) == 1:
                out.append(f"{indent}alias {prefix}.{group[0]}")
            elif group:
                out.append(f"{indent}alias {prefix}.{{{', '.join(group)}}}")
        return "\n".join(out)
    text = re.sub(r"(?m)^([ \t]*)alias Condukt\.Test\.Netns\.\{([^}]*)\}", brace, text)
    text = re.sub(r"Condukt\.Test\.Netns\.(" + "|".join(MOVED) + r")\b", r"Condukt.Dev.Netns.\1", text)
    return text
paths = sys.argv[1:] or [str(p) for d in ("dev", "test", "scripts", "bench", "lib")
                         for p in pathlib.Path(d).rglob("*") if p.suffix in (".ex", ".exs")]
for p in paths:
    s = pathlib.Path(p).read_text()
    t = fix(s)
    if t != s:
        pathlib.Path(p).write_text(t)
        print("renamed in", p)
