# libtest's human output -> one line per test:
#   PASS name | FAIL name[ -- why] | SKIP name -- why
# and last "RESULT <tests announced> <tests seen> <exit status>".
# Knows: results on the "test NAME ... " line or on a later line (when the
# test wrote to stderr uncaptured), "SKIPPED NAME" written by a test, the
# first line of a panic message, a run cut short (the test still pending).
# Input may carry "VMTEST-RC <label> <status>" (the guest's runner); else
# the status comes in as -v rc=N.
function result(n, r) {
    if (n in seen) return
    seen[n] = 1; order[++cnt] = n; res[n] = r; pending = ""
}
/^running [0-9]+ tests?$/ { expected += $2 }
/VMTEST-RC / { rc = $NF }
{
    line = $0
    if (match(line, /SKIPPED [^ :]+/)) {
        skip[substr(line, RSTART + 8, RLENGTH - 8)] = 1
        if (pending != "") skip[pending] = 1
    }
    if (match(line, /^test [^ ]+ \.\.\. /)) {
        n = substr(line, 6, RLENGTH - 10); rest = substr(line, RLENGTH + 1)
        if (rest ~ /SKIPPED/) skip[n] = 1
        if (rest ~ /(^|[^A-Za-z_])ok$/) result(n, "ok")
        else if (rest ~ /FAILED$/) result(n, "FAILED")
        else if (rest ~ /^ignored/) result(n, "ignored")
        else pending = n
        next
    }
    if (pending != "") {
        if (line ~ /(^|[^A-Za-z_])ok$/) result(pending, "ok")
        else if (line ~ /FAILED$/) result(pending, "FAILED")
        else if (line ~ /^ignored/) result(pending, "ignored")
    }
    if (match(line, /^---- [^ ]+ stdout ----$/)) { sect = substr(line, 6, RLENGTH - 17); next }
    if (sect != "" && line ~ /panicked at/) { want_msg = sect; next }
    if (want_msg != "" && line != "") { why[want_msg] = line; want_msg = "" }
    if (line ~ /^failures:$/ || line ~ /^test result:/) sect = ""
}
END {
    for (i = 1; i <= cnt; i++) {
        n = order[i]
        if (res[n] == "ok" && (n in skip)) print "SKIP " n " -- printed SKIPPED"
        else if (res[n] == "ok") print "PASS " n
        else if (res[n] == "ignored") print "SKIP " n " -- ignored"
        else print "FAIL " n (n in why ? " -- " why[n] : "")
    }
    if (pending != "") print "FAIL " pending " -- no result: " (rc == "" ? "the guest stopped before the test ended" : rc == 137 ? "killed by the timeout" : "the test binary died (status " rc ")")
    print "RESULT " expected + 0 " " cnt + (pending != "" ? 1 : 0) " " rc
}
