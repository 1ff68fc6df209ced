#!/usr/bin/env python3
"""Extract torch/include/ of one torch wheel from PyPI into a directory,
without downloading the wheel (500 MB and more): pip resolves the wheel's
URL (so the user's index settings apply), then HTTP range requests read the
zip's central directory and only the members under torch/include/, which
lie together in the wheel (some tens of MB).

Usage: fetch_torch_headers.py PIP VERSION DEST
  PIP      a pip executable of the Python the headers are for (its tags pick the wheel)
  VERSION  e.g. 2.14.1 or 2.14.* (anything pip accepts after torch==)
  DEST     created as DEST/torch/include/...; DEST/VERSION holds the version
Exit 0 when DEST holds the headers, 1 with one line on stderr otherwise.
Falls back to `pip download` + unzip when the server ignores ranges."""
import io, json, os, shutil, subprocess, sys, tempfile, urllib.request, zipfile

BLOCK = 8 << 20


class RangeFile(io.RawIOBase):
    """A read-only seekable file over HTTP range requests, cached by block:
    zipfile reads members in order, so contiguous members cost one request
    per block."""

    def __init__(self, url):
        self.url, self.pos, self.blocks = url, 0, {}
        with self._get(0, 0) as head:
            if head.status != 206:
                raise OSError("the server ignores range requests")
            self.size = int(head.headers["Content-Range"].rsplit("/", 1)[1])

    def _get(self, lo, hi):
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={lo}-{hi}"})
        return urllib.request.urlopen(req, timeout=120)

    def _block(self, i):
        if i not in self.blocks:
            lo = i * BLOCK
            with self._get(lo, min(lo + BLOCK, self.size) - 1) as r:
                self.blocks[i] = r.read()
        return self.blocks[i]

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, off, whence=0):
        self.pos = {0: off, 1: self.pos + off, 2: self.size + off}[whence]
        return self.pos

    def read(self, n=-1):
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        out = bytearray()
        while self.pos < end:
            b = self._block(self.pos // BLOCK)
            o = self.pos % BLOCK
            take = b[o:o + (end - self.pos)]
            out += take
            self.pos += len(take)
        return bytes(out)


def extract(zf, dest):
    names = [n for n in zf.namelist() if n.startswith("torch/include/") and not n.endswith("/")]
    if not names:
        raise OSError("the wheel has no torch/include/")
    # in wheel order, so the range reads stay sequential
    names.sort(key=lambda n: zf.getinfo(n).header_offset)
    for n in names:
        zf.extract(n, dest)
    return len(names)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    pip, version, dest = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        subprocess.run([pip, "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
                        "--report", report, f"torch=={version}"], check=True,
                       stdout=subprocess.DEVNULL)
        item = json.load(open(report))["install"][0]
        url, got = item["download_info"]["url"], item["metadata"]["version"]
        part = dest + ".part"
        shutil.rmtree(part, ignore_errors=True)
        try:
            n = extract(zipfile.ZipFile(RangeFile(url)), part)
        except OSError as e:
            if "range" not in str(e):
                raise
            subprocess.run([pip, "download", "--no-deps", "--quiet", "-d", tmp, f"torch=={got}"], check=True)
            whl = [f for f in os.listdir(tmp) if f.endswith(".whl")][0]
            n = extract(zipfile.ZipFile(os.path.join(tmp, whl)), part)
        with open(os.path.join(part, "VERSION"), "w") as f:
            f.write(got + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(part, dest)
    print(f"torch {got}: {n} headers in {dest}")


if __name__ == "__main__":
    try:
        main()
    except (OSError, subprocess.CalledProcessError, KeyError, IndexError, zipfile.BadZipFile) as e:
        print(f"fetch_torch_headers: {e}", file=sys.stderr)
        sys.exit(1)
