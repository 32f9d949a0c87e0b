package mounttest

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// User is an identity to run commands as: tests of a mount with allow_other
// act as several users and groups.
type User struct {
	Uid, Gid uint32
	Groups   []uint32 // supplementary groups
}

// Command returns a command that runs as u (needs root). Its output is
// collected by CombinedOutput or Output as usual.
func (u User) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{
		Uid: u.Uid, Gid: u.Gid, Groups: u.Groups, NoSetGroups: false,
	}}
	if u.Groups == nil {
		cmd.SysProcAttr.Credential.Groups = []uint32{}
	}
	return cmd
}

// Sh runs a shell script as u in dir and returns its combined output and
// error (an *exec.ExitError when the script failed).
func (u User) Sh(t testing.TB, dir, script string) (string, error) {
	t.Helper()
	// The shell changes into dir itself: a chdir between fork and exec into
	// a mount that this very process serves can hang (the child holds a
	// copy of the FUSE descriptor and waits for its own parent).
	cmd := u.Command("sh", "-c", `cd "$1" || exit 1; `+script, "sh", dir)
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// NeedRoot skips the test unless it runs as root (on CI it fails instead):
// acting as other users needs it.
func NeedRoot(t testing.TB) {
	t.Helper()
	if syscall.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("this test acts as other users and needs root; CI runs as root")
		}
		t.Skip("needs root to act as other users")
	}
}
