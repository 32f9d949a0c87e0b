#!/bin/sh
# Sets up a fresh Debian machine for cairn, builds it and runs the demo:
# installs fuse3 (and the tools the tests use), a Go toolchain if needed,
# builds bin/cairn, then mounts the embedded demo stack, shows it working
# and unmounts. --no-demo skips the demo (CI). --install also installs cairn
# (install.sh: PREFIX/bin/cairn, /sbin/mount.fuse.cairn, the man page and the
# systemd template cairn@.service; PREFIX=/usr/local unless set).
set -eu
cd "$(dirname "$0")"
GO_WANT=1.26

need_root() { if [ "$(id -u)" != 0 ]; then echo "setup.sh: run as root (it installs packages and mounts FUSE)"; exit 1; fi; }
need_root

echo "== installing packages (apt)"
export DEBIAN_FRONTEND=noninteractive
# glusterfs-server, glusterfs-client: the GlusterFS lower of internal/glustertest (test/gluster.sh;
# docs/distributed.md); iproute2 (ip) and util-linux (unshare, nsenter) for its network namespace.
pkgs="fuse3 attr acl libcap2-bin xfsprogs python3 ca-certificates curl unzip xz-utils gcc make glusterfs-server glusterfs-client iproute2 util-linux"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
	apt-get update -qq || true
	apt-get install -y -qq $missing
fi
# xfstests/run (part of ./test.sh): the packages that build the suite and that its tests call.
xmissing=""
for p in $(sed 's/#.*//' xfstests/packages); do dpkg -s "$p" >/dev/null 2>&1 || xmissing="$xmissing $p"; done
if [ -n "$xmissing" ]; then
	[ -n "$missing" ] || apt-get update -qq || true
	apt-get install -y -qq --no-install-recommends $xmissing
fi
# test/cross.sh (part of ./test.sh) runs the arm64 in-process tests under qemu-aarch64
# (docs/portability.md); without its recommends (qemu-user-binfmt would register handlers system-wide).
if ! dpkg -s qemu-user >/dev/null 2>&1; then
	[ -n "$missing$xmissing" ] || apt-get update -qq || true
	apt-get install -y -qq --no-install-recommends qemu-user
fi
modprobe fuse 2>/dev/null || true
# allow_other for non-root users of a mount, as the tests do.
grep -q '^user_allow_other' /etc/fuse.conf 2>/dev/null || echo user_allow_other >> /etc/fuse.conf

echo "== Go toolchain"
export PATH="/usr/local/go/bin:$PATH:$HOME/go/bin"
have_go() {
	command -v go >/dev/null 2>&1 || return 1
	v=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
	[ "$(printf '%s\n%s\n' "$GO_WANT" "$v" | sort -V | head -1)" = "$GO_WANT" ]
}
if ! have_go; then
	if command -v go >/dev/null 2>&1 && go version | grep -qE 'go1\.(2[1-9]|[3-9][0-9])'; then
		: # go >= 1.21 downloads the toolchain go.mod asks for by itself
	else
		# No usable Go: fetch the toolchain from the Go module proxy.
		tc="v0.0.1-go1.26.8.linux-amd64"
		tmp=$(mktemp -d)
		curl -fsSL -o "$tmp/go.zip" "https://proxy.golang.org/golang.org/toolchain/@v/$tc.zip"
		rm -rf /usr/local/go && mkdir -p /usr/local/go
		unzip -q "$tmp/go.zip" -d "$tmp/x"
		cp -a "$tmp/x/golang.org/toolchain@$tc/." /usr/local/go/
		chmod +x /usr/local/go/bin/* /usr/local/go/pkg/tool/*/* 2>/dev/null || true
		rm -rf "$tmp"
	fi
fi
go version

echo "== building bin/cairn"
go build -o bin/cairn ./cmd/cairn
./bin/cairn version

for a in "$@"; do
	if [ "$a" = --install ]; then
		echo "== installing"
		./install.sh
	fi
done

case " $* " in *" --no-demo "*) ;; *)
	echo "== demo"
	./bin/cairn demo ;;
esac
