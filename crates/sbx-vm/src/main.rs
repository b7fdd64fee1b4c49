fn main() {
    sbx_vm::main()
}
