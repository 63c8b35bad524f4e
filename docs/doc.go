// Package docs holds no code: it is DSec's documentation (the Markdown
// files in this directory) and the tests that keep the documentation of
// the whole repository whole. Every link in a Markdown file must lead to a
// file of the repository, and to a heading of it if it names one; no link
// may lead outside the repository; and the layout tables of README.md and
// docs/README.md must list every package of the module, and nothing that
// does not exist.
package docs
