"""Digests of the payloads spanpack writes for the bench shapes, to compare
across CPUs and interpreters (CI compares arm64's with x86-64's).

    python scripts/payload_digests.py OUT      # writes one line per payload
    python scripts/payload_digests.py --compare A B [C ...]

Each line: shape, version, input form, entry point, payload length, sha256.
The shapes are spanpack.samples' (their --quick sizes), each through every
version and entry point, as slotted objects, dicts and (where ddtrace
installs) ddtrace Spans.  v1.0's payload fields that default to this
interpreter's (language_version) or spanpack's (tracer_version) are fixed,
so every interpreter must write the same bytes.

--compare exits 1 if the files disagree on any payload they both have, or if
one lacks a payload of the forms every interpreter has (slotted, dicts).
"""

import hashlib
import sys

V10_FIELDS = {"language_version": "fixed", "tracer_version": "fixed"}
VERSIONS = ("v0.4", "v0.5", "v1.0")
EVERYWHERE = ("slotted", "dicts")


def _payloads(encoder, entry, traces):
    if entry == "encode_traces":
        return [encoder.encode_traces(traces)]
    if entry == "join_encoded":
        return [encoder.join_encoded([encoder.encode_trace(trace) for trace in traces])]
    for trace in traces:
        encoder.put(trace)
    return [payload for payload, _ in encoder.encode()]


def digests():
    from spanpack import TraceMsgPackEncoder, samples

    forms = {"slotted": samples.as_slotted, "dicts": samples.as_dicts}
    if samples.ddtrace_available():
        forms["ddtrace"] = samples.as_ddtrace
    lines = []
    for shape in samples.shape_names():
        records = samples.build(shape, quick=True)
        for version in VERSIONS:
            options = V10_FIELDS if version == "v1.0" else {}
            for form, convert in forms.items():
                fields = "ddtrace" if form == "ddtrace" else None
                for entry in ("encode_traces", "join_encoded", "put"):
                    encoder = TraceMsgPackEncoder(version, fields, max_size=1 << 30, **options)
                    for number, payload in enumerate(_payloads(encoder, entry, convert(records))):
                        key = "%s %s %s %s#%d" % (shape, version, form, entry, number)
                        lines.append("%s %d %s" % (key, len(payload), hashlib.sha256(payload).hexdigest()))
    return lines


def _read(path):
    """{"shape version form entry#n": "length sha256"}"""
    table = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            words = line.split()
            if words:
                table[" ".join(words[:4])] = " ".join(words[4:])
    return table


def compare(paths):
    tables = {path: _read(path) for path in paths}
    first, *others = paths
    problems = []
    for path in paths:
        table = tables[path]
        if not table:
            problems.append("%s: no payloads" % path)
        missing = [k for k in tables[first] if k.split()[2] in EVERYWHERE and k not in table]
        missing += [k for k in table if k.split()[2] in EVERYWHERE and k not in tables[first]]
        problems += ["%s: %s missing on one side" % (path, k) for k in missing[:5]]
    compared = 0
    for path in others:
        for key in sorted(set(tables[first]) & set(tables[path])):
            compared += 1
            if tables[first][key] != tables[path][key]:
                problems.append("%s: %s: %s here, %s in %s" % (path, key, tables[path][key], tables[first][key], first))
    for problem in problems[:40]:
        print("payload digests: " + problem)
    if problems:
        print("payload digests: %d differences among %s" % (len(problems), ", ".join(paths)))
        return 1
    print("payload digests: identical (%d payloads compared across %s)" % (compared, ", ".join(paths)))
    return 0


def main(argv):
    if len(argv) >= 3 and argv[0] == "--compare":
        return compare(argv[1:])
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    lines = digests()
    with open(argv[0], "w", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
    print("payload digests: %d payloads written to %s" % (len(lines), argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
