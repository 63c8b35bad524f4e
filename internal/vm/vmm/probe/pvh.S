# The probe guest of vmm.ProbeAccel: a PVH kernel (an ELF with a
# XEN_ELFNOTE_PHYS32_ENTRY note, which QEMU's -kernel boots through the
# machine's firmware, as it boots Linux's vmlinux). Entered in 32-bit
# protected mode without paging, it walks on to long mode as Linux does,
# checks that RAM holds a value, and writes 0x2a to the isa-debug-exit port
# 0xf4: QEMU exits with status 0x2a<<1|1 = 85. Anything else (a hang, a
# triple fault, a KVM error) means the accelerator cannot run our guests.
#
# Rebuild: as --64 -o pvh.o pvh.S && ld -m elf_x86_64 -Ttext=0x100000 \
#   -z noexecstack --build-id=none -s -o pvh.elf pvh.o
	.text
	.code32
	.globl	_start
_start:
	cli
	lgdt	gdtr
	movl	$0x10, %eax
	movw	%ax, %ds
	movw	%ax, %es
	movw	%ax, %ss
	# Page tables at 0x1000 (PML4), 0x2000 (PDPT), 0x3000 (PD): one 2 MiB
	# page maps the first 2 MiB of RAM onto itself.
	movl	$0x1000, %edi
	xorl	%eax, %eax
	movl	$(3*4096/4), %ecx
	rep stosl
	movl	$0x2003, 0x1000
	movl	$0x3003, 0x2000
	movl	$0x83, 0x3000
	movl	%cr4, %eax
	orl	$0x20, %eax		# PAE
	movl	%eax, %cr4
	movl	$0x1000, %eax
	movl	%eax, %cr3
	movl	$0xc0000080, %ecx	# EFER
	rdmsr
	orl	$0x100, %eax		# LME
	wrmsr
	movl	%cr0, %eax
	orl	$0x80000001, %eax	# PG, PE
	movl	%eax, %cr0
	ljmpl	$0x18, $lm64

	.code64
lm64:
	movq	$0x123456789abcdef0, %rax
	movq	%rax, 0x5000
	cmpq	0x5000, %rax
	jne	fail
	movb	$0x2a, %al
	outb	%al, $0xf4
fail:
	hlt
	jmp	fail

	.p2align 3
gdt:
	.quad	0
	.quad	0x00cf9b000000ffff	# 0x08: 32-bit code
	.quad	0x00cf93000000ffff	# 0x10: data
	.quad	0x00af9b000000ffff	# 0x18: 64-bit code
gdtr:
	.word	gdtr - gdt - 1
	.long	gdt

	.section .note.Xen, "a", @note
	.p2align 2
	.long	4, 4, 18		# namesz, descsz, XEN_ELFNOTE_PHYS32_ENTRY
	.asciz	"Xen"
	.long	_start
