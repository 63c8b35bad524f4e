package audit

// MatchPath matches a slash-separated absolute path against a rule's
// path pattern ("*" one element, "**" any number), for other packages
// that select files the way the rules do (sealed grading's protected
// files).
func MatchPath(pattern, name string) bool { return matchPath(pattern, name) }
