package sys

// Xattr is one extended attribute of a file.
type Xattr struct {
	Name  string
	Value []byte
}
