fn main() {
    sbx_vm_init::guest::main()
}
