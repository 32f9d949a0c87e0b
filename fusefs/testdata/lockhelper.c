// lockhelper runs lock commands, one a line on standard input, and prints
// one result line for each on standard output. fusefs/locks_test.go runs it
// as separate processes on a plain directory and through cairn mounts, and
// compares the two transcripts. It is C, not Go, because Go installs its
// signal handlers with SA_RESTART, which restarts an interrupted F_SETLKW or
// flock instead of failing it with EINTR.
//
// Commands (X is a descriptor name, a-z):
//   open X PATH           open PATH read-write as X
//   close X
//   dup X Y               Y = dup(X)
//   setlk|setlkw|getlk|ofdsetlk|ofdsetlkw|ofdgetlk X TYPE START LEN
//                         fcntl with a struct flock; TYPE is r, w or u
//   flock X sh|ex|un|shnb|exnb
//   lockf X tlock|lock|ulock LEN
//   alarm MS              SIGALRM in MS milliseconds (handler without SA_RESTART)
//   pid                   this process's pid
// Results: "ok", "err ENAME", "pid N", and for the get commands "unlck" or
// "TYPE START LEN pid N".
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/time.h>
#include <unistd.h>

static int fds[26];

static void onalarm(int sig) { (void)sig; }

static int slot(const char *s) {
	if (s[0] < 'a' || s[0] > 'z' || s[1] != 0) {
		fprintf(stderr, "lockhelper: bad descriptor name %s\n", s);
		exit(2);
	}
	return s[0] - 'a';
}

static void result(int r) {
	if (r < 0)
		printf("err %s\n", strerrorname_np(errno));
	else
		printf("ok\n");
}

static int lktype(const char *s) {
	switch (s[0]) {
	case 'r': return F_RDLCK;
	case 'w': return F_WRLCK;
	case 'u': return F_UNLCK;
	}
	fprintf(stderr, "lockhelper: bad lock type %s\n", s);
	exit(2);
}

static char lkname(int t) { return t == F_RDLCK ? 'r' : t == F_WRLCK ? 'w' : '?'; }

int main(void) {
	struct sigaction sa;
	char line[4096], op[32], a1[4000], a2[64], a3[64], a4[64];
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = onalarm; // no SA_RESTART: a blocked lock call ends with EINTR
	sigaction(SIGALRM, &sa, NULL);
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int i = 0; i < 26; i++)
		fds[i] = -1;
	while (fgets(line, sizeof line, stdin)) {
		a1[0] = a2[0] = a3[0] = a4[0] = 0;
		if (sscanf(line, "%31s %3999s %63s %63s %63s", op, a1, a2, a3, a4) < 1)
			continue;
		if (!strcmp(op, "open")) {
			int s = slot(a1);
			fds[s] = open(a2, O_RDWR);
			result(fds[s]);
		} else if (!strcmp(op, "close")) {
			int s = slot(a1);
			result(close(fds[s]));
			fds[s] = -1;
		} else if (!strcmp(op, "dup")) {
			int s = slot(a2);
			fds[s] = dup(fds[slot(a1)]);
			result(fds[s]);
		} else if (strstr(op, "lk") && strcmp(op, "flock")) {
			int cmd;
			if (!strcmp(op, "setlk")) cmd = F_SETLK;
			else if (!strcmp(op, "setlkw")) cmd = F_SETLKW;
			else if (!strcmp(op, "getlk")) cmd = F_GETLK;
			else if (!strcmp(op, "ofdsetlk")) cmd = F_OFD_SETLK;
			else if (!strcmp(op, "ofdsetlkw")) cmd = F_OFD_SETLKW;
			else if (!strcmp(op, "ofdgetlk")) cmd = F_OFD_GETLK;
			else {
				fprintf(stderr, "lockhelper: unknown command %s\n", op);
				return 2;
			}
			struct flock fl;
			memset(&fl, 0, sizeof fl);
			fl.l_type = lktype(a2);
			fl.l_whence = SEEK_SET;
			fl.l_start = atoll(a3);
			fl.l_len = atoll(a4);
			int r = fcntl(fds[slot(a1)], cmd, &fl);
			if (r < 0 || (cmd != F_GETLK && cmd != F_OFD_GETLK))
				result(r);
			else if (fl.l_type == F_UNLCK)
				printf("unlck\n");
			else
				printf("%c %lld %lld pid %d\n", lkname(fl.l_type), (long long)fl.l_start, (long long)fl.l_len, (int)fl.l_pid);
		} else if (!strcmp(op, "flock")) {
			int how;
			if (!strcmp(a2, "sh")) how = LOCK_SH;
			else if (!strcmp(a2, "ex")) how = LOCK_EX;
			else if (!strcmp(a2, "un")) how = LOCK_UN;
			else if (!strcmp(a2, "shnb")) how = LOCK_SH | LOCK_NB;
			else if (!strcmp(a2, "exnb")) how = LOCK_EX | LOCK_NB;
			else {
				fprintf(stderr, "lockhelper: bad flock operation %s\n", a2);
				return 2;
			}
			result(flock(fds[slot(a1)], how));
		} else if (!strcmp(op, "lockf")) {
			int how;
			if (!strcmp(a2, "tlock")) how = F_TLOCK;
			else if (!strcmp(a2, "lock")) how = F_LOCK;
			else if (!strcmp(a2, "ulock")) how = F_ULOCK;
			else {
				fprintf(stderr, "lockhelper: bad lockf operation %s\n", a2);
				return 2;
			}
			result(lockf(fds[slot(a1)], how, atoll(a3)));
		} else if (!strcmp(op, "alarm")) {
			struct itimerval it;
			memset(&it, 0, sizeof it);
			it.it_value.tv_sec = atoi(a1) / 1000;
			it.it_value.tv_usec = atoi(a1) % 1000 * 1000;
			result(setitimer(ITIMER_REAL, &it, NULL));
		} else if (!strcmp(op, "pid")) {
			printf("pid %d\n", (int)getpid());
		} else {
			fprintf(stderr, "lockhelper: unknown command %s\n", op);
			return 2;
		}
	}
	return 0;
}
