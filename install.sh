#!/bin/sh
# Installs a built cairn (bin/cairn, from ./setup.sh) as a system's own:
#
#   PREFIX/bin/cairn                             the command
#   SBINDIR/mount.fuse.cairn                     mount(8)'s helper: mount -t fuse.cairn, fstab
#   PREFIX/share/man/man1/cairn.1                the manual (cairn help and each command's --help)
#   PREFIX/lib/systemd/system/cairn@.service     the systemd template (dist/cairn@.service)
#
# PREFIX defaults to /usr/local, SBINDIR to /sbin (where mount(8) looks for
# helpers); DESTDIR, if set, is prepended to every path (for packaging).
# Run by './setup.sh --install'; alone, it needs bin/cairn built.
set -eu
cd "$(dirname "$0")"
PREFIX=${PREFIX:-/usr/local}
SBINDIR=${SBINDIR:-/sbin}
DESTDIR=${DESTDIR:-}
BIN=${BIN:-bin/cairn}
if [ ! -x "$BIN" ]; then
	echo "install.sh: $BIN is not built: run ./setup.sh --install (or go build -o bin/cairn ./cmd/cairn)" >&2
	exit 1
fi
cairn=$PREFIX/bin/cairn

install -d "$DESTDIR$PREFIX/bin" "$DESTDIR$SBINDIR" "$DESTDIR$PREFIX/share/man/man1" "$DESTDIR$PREFIX/lib/systemd/system"
install -m 755 "$BIN" "$DESTDIR$cairn.new"
mv "$DESTDIR$cairn.new" "$DESTDIR$cairn"
sed "s|@CAIRN@|$cairn|" xfstests/mount.fuse.cairn > "$DESTDIR$SBINDIR/mount.fuse.cairn.new"
chmod 755 "$DESTDIR$SBINDIR/mount.fuse.cairn.new"
mv "$DESTDIR$SBINDIR/mount.fuse.cairn.new" "$DESTDIR$SBINDIR/mount.fuse.cairn"
sed "s|@CAIRN@|$cairn|" dist/cairn@.service > "$DESTDIR$PREFIX/lib/systemd/system/cairn@.service"
chmod 644 "$DESTDIR$PREFIX/lib/systemd/system/cairn@.service"

# The manual: cairn help, then each command's --help, verbatim.
man=$DESTDIR$PREFIX/share/man/man1/cairn.1
{
	printf '.TH CAIRN 1 "" "cairn %s" "User Commands"\n' "$("$BIN" version | sed 's/^cairn //')"
	printf '.SH NAME\ncairn \\- stackable file systems over any directory\n'
	printf '.SH DESCRIPTION\n.nf\n'
	"$BIN" help | sed 's/\\/\\e/g; s/^\./\\\&./; s/^'"'"'/\\\&'"'"'/'
	printf '.fi\n'
	for c in $("$BIN" help | sed -n '/^Commands:/,/^$/p' | awk 'NF && $1 != "Commands:" {print $1}'); do
		printf '.SH "CAIRN %s"\n.nf\n' "$(echo "$c" | tr a-z A-Z)"
		"$BIN" "$c" --help 2>&1 | sed 's/\\/\\e/g; s/^\./\\\&./; s/^'"'"'/\\\&'"'"'/'
		printf '.fi\n'
	done
	printf '.SH FILES\n.nf\n%s/mount.fuse.cairn\n%s/lib/systemd/system/cairn@.service\n/etc/cairn/*.toml\n.fi\n' "$SBINDIR" "$PREFIX"
	printf '.SH SEE ALSO\nmount(8), fstab(5), systemd.service(5); docs/tutorial.md in the source\n'
} > "$man"
chmod 644 "$man"
echo "installed: $DESTDIR$cairn, $DESTDIR$SBINDIR/mount.fuse.cairn, $man, $DESTDIR$PREFIX/lib/systemd/system/cairn@.service"
