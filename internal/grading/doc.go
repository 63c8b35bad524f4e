// Package grading holds the host-side parts of sealed grading: which of
// an agent's files a grading may see, and the verdict read from the
// grader's JUnit report. Both run outside every sandbox: a grading's
// verdict depends on nothing a sandbox says but the report file of the
// grader's own run, parsed here.
package grading
